"""Cancelling an awaited execution exactly where its steps wait (``test_cancel_sweep*.py``), and checking that
every worker it had was destroyed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from sandforge.sandbox import ExecutionOutcome, Sandbox
from sandforge.sandbox.backends.base import Worker
from sandforge.sandbox.pool import WarmPool
from sandforge.sandbox.steps import Await, Blocking, Detach, Effect, Poll, Steps

from .procs import alive


def kind(effect: Effect) -> str:
    if isinstance(effect, Await):
        return "acquire"
    if isinstance(effect, Poll):
        return "poll"
    if isinstance(effect, Detach):
        return "detach"
    assert isinstance(effect, Blocking)
    return "exit" if effect.on_loop is not None else "blocking"


class Sweep:
    """``Sandbox.outline`` whose task is cancelled as its steps yield the first effect of kind ``at`` (the
    cancel is requested while the task runs: it lands at that wait), recording every effect's kind and the
    worker handed out. ``target`` is the task to cancel (default: the execution's own, the current one; an
    awaited agent call's task, say)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, at: str | None, target: Callable[[], asyncio.Task[Any]] | None = None
    ) -> None:  # fmt: skip
        self.at = at
        self.target = target
        self.kinds: list[str] = []
        self.handed: list[Worker] = []
        self.fired = False
        original = Sandbox.outline

        def outline(sb: Sandbox, *args: Any) -> Steps[ExecutionOutcome]:
            return self._wrap(original(sb, *args))

        monkeypatch.setattr(Sandbox, "outline", outline)

    def _wrap(self, inner: Steps[ExecutionOutcome]) -> Steps[ExecutionOutcome]:
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = inner.send(sent) if error is None else inner.throw(error)
            except StopIteration as done:
                result: ExecutionOutcome = done.value
                return result
            self.kinds.append(kind(effect))
            if not self.fired and kind(effect) == self.at:
                self.fired = True
                task = self.target() if self.target is not None else asyncio.current_task()
                assert task is not None and task.cancel()
            sent, error = None, None
            try:
                sent = yield effect
            except BaseException as exc:  # thrown in by the driver: passed on to the steps
                error = exc
            if isinstance(effect, Await) and error is None:
                self.handed.append(sent)


class Spawns:
    """Every worker the subprocess backend starts for ``sandbox`` (its pool's and the cold ones)."""

    def __init__(self, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[Worker] = []
        backend = sandbox._backend("subprocess")
        spawn = backend.spawn

        def recorded(*args: Any, **kwargs: Any) -> Worker:
            worker = spawn(*args, **kwargs)
            self.started.append(worker)
            return worker

        monkeypatch.setattr(backend, "spawn", recorded)


def dead(worker: Worker) -> bool:
    """Killed, reaped and cleaned up: ``destroy`` ran (its descriptors closed, a work directory of its own
    removed: the backend's shared mount point stays until the backend closes)."""
    w: Any = worker
    return w._destroyed and not (w.owns_workdir and w._workdir.exists()) and not alive({w.pid})


async def ended(workers: list[Worker]) -> bool:
    """The workers are dead once the clean-up handed to a thread had its time (a hang guard, not a goal)."""
    for _ in range(2000):
        if all(dead(w) for w in workers):
            return True
        await asyncio.sleep(0.01)
    return False


def left_alive(spawns: Spawns, pool: WarmPool) -> list[Worker]:
    """Started workers still alive that the pool does not hold ready (for nobody: leaked)."""
    with pool._lock:
        ready = {id(w) for w in pool._ready}
    return [w for w in spawns.started if id(w) not in ready and not dead(w)]
