"""A cancellation delivered at each boundary of an awaited execution, deterministically (issue 24).

Each test injects the cancel at one place (no timing): before the execution task runs, while its worker is
started on a thread, after the start but before the worker is handed over, at each effect its steps yield (the
cancel is requested while the task runs, so it lands exactly at that wait), twice (during the clean-up too), and
in the call thread of an awaited agent call between ``CallScope.check`` and the execution being tracked. Every
window must end the same way: ``CancelledError``, the worker killed and reaped, nothing committed or recorded.
A guard (``asyncio.timeout``) turns a lost cancellation into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import CallLog
from sandforge.runtime.agent.awaited import CallsClosed, CallScope
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import AsyncSandbox, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.base import Worker
from sandforge.sandbox.protocol import CallFrame
from sandforge.sandbox.steps import Effect, Steps

from .procs import alive, gone, workers

T = TypeVar("T")
LONG = Limits(timeout_s=600)
SPIN = "while True:\n    pass"
#: Effects: a poll (the call frame comes), the nested call's answer (Blocking), a poll that only a cancel ends.
NEST_THEN_SPIN = "tool('helper').work()\nprint('asked')\nwhile True:\n    pass"
SPIN_AFTER_WRITING = "context['total'] = 999\nwhile True:\n    pass"
GUARD_S = 120.0  # a lost cancellation fails the test after this, instead of hanging it for the 600 s limit


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def answer(call: CallFrame) -> dict[str, Any]:
    return {"status": "ok", "value": 1}


@pytest.fixture
def asb() -> Iterator[AsyncSandbox]:
    """Cold (no warm pool): the worker an execution gets is started for it."""
    sandbox = Sandbox(SandboxConfig(backend="subprocess", pool_size=0, limits=LONG))
    asb = AsyncSandbox(sandbox)
    try:
        yield asb
    finally:
        asb.threads.shutdown()
        sandbox.close()


class Spawns:
    """The workers the backend starts, with a hook around each start (on the start's thread)."""

    def __init__(self, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[Worker] = []
        self.before: Callable[[], None] = lambda: None
        self.after: Callable[[], None] = lambda: None
        backend = sandbox._backend("subprocess")
        spawn = backend.spawn

        def hooked(*args: Any, **kwargs: Any) -> Any:
            self.before()
            worker = spawn(*args, **kwargs)
            self.started.append(worker)
            self.after()
            return worker

        monkeypatch.setattr(backend, "spawn", hooked)

    def all_gone(self) -> bool:
        return all(not w.alive() and not alive({w.pid}) for w in self.started)


def cancel_from_thread(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` from a start's thread and return once the loop has delivered it (FIFO callbacks)."""
    delivered = threading.Event()
    loop.call_soon_threadsafe(task.cancel)
    loop.call_soon_threadsafe(delivered.set)
    assert delivered.wait(60)


async def cancelled(task: asyncio.Task[Any]) -> None:
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.shield(task)
        assert task.cancelled()


def test_cancel_before_the_execution_task_runs(asb: AsyncSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    spawns = Spawns(asb.sandbox, monkeypatch)

    async def main() -> None:
        task = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=LONG)))
        task.cancel()
        await cancelled(task)

    run(main())
    assert spawns.started == []


@pytest.mark.parametrize("when", ["during", "after"])
def test_cancel_while_the_worker_is_started(
    asb: AsyncSandbox, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:  # fmt: skip
    """``during``: delivered before the start begins; ``after``: the worker is up but not yet handed over."""
    spawns = Spawns(asb.sandbox, monkeypatch)

    async def main() -> set[int]:
        loop = asyncio.get_running_loop()
        before = workers(asb.sandbox)
        task = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=LONG)))
        hook = lambda: cancel_from_thread(loop, task)  # noqa: E731
        if when == "during":
            spawns.before = hook
        else:
            spawns.after = hook
        await cancelled(task)
        return await gone(workers(asb.sandbox) - before)

    assert not run(main())
    assert len(spawns.started) == 1 and spawns.all_gone()


def cancel_at(
    original: Callable[..., Steps[Any]], at: set[int], seen: list[Effect]
) -> Callable[..., Steps[Any]]:  # fmt: skip
    """``Sandbox.run_steps`` whose task is cancelled as it yields its effects numbered ``at`` (from 0): the cancel
    is requested while the task runs, so it lands exactly at that wait."""

    def run_steps(*args: Any) -> Steps[Any]:
        inner = original(*args)
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = inner.send(sent) if error is None else inner.throw(error)
            except StopIteration as done:
                return done.value
            if len(seen) in at:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
            seen.append(effect)
            sent, error = None, None
            try:
                sent = yield effect
            except BaseException as exc:  # thrown in by the driver: passed on to the steps
                error = exc

    return run_steps


@pytest.mark.parametrize("at", [{0}, {1}, {2}, {0, 1}, {1, 2}, {2, 3}])
def test_cancel_at_each_step_of_the_execution(
    asb: AsyncSandbox, monkeypatch: pytest.MonkeyPatch, at: set[int]
) -> None:  # fmt: skip
    """Effects 0-2 are: waiting for the call frame, the nested call's answer, waiting on the spinning program;
    a second number cancels again during the clean-up (its kill and reap)."""
    spawns = Spawns(asb.sandbox, monkeypatch)
    seen: list[Effect] = []
    monkeypatch.setattr(Sandbox, "run_steps", staticmethod(cancel_at(Sandbox.run_steps, at, seen)))

    async def main() -> set[int]:
        before = workers(asb.sandbox)
        request = ExecutionRequest(code=NEST_THEN_SPIN, limits=LONG)
        task = asyncio.create_task(asb.execute(request, bridge=answer))
        await cancelled(task)
        return await gone(workers(asb.sandbox) - before)

    assert not run(main())
    assert len(spawns.started) == 1 and spawns.all_gone()
    assert len(seen) >= min(at) + 1  # the cancel was injected where asked


@contextlib.contextmanager
def scope_cancelled_after(monkeypatch: pytest.MonkeyPatch, method: str) -> Iterator[list[bool]]:
    """Cancel the awaited call's scope (on the call thread) right after ``CallScope.<method>`` of its first
    execution: ``check`` (before the execution is started on the loop and tracked) or ``tracking`` (once
    tracked)."""
    fired: list[bool] = []
    original = getattr(CallScope, method)

    if method == "check":

        def check(self: CallScope) -> None:
            original(self)
            if not fired:
                fired.append(True)
                self.cancel()

        monkeypatch.setattr(CallScope, "check", check)
    else:

        @contextlib.contextmanager
        def tracking(self: CallScope, cancel: Callable[[], None]) -> Iterator[None]:
            with original(self, cancel):
                if not fired:
                    fired.append(True)
                    self.cancel()
                yield

        monkeypatch.setattr(CallScope, "tracking", tracking)
    yield fired


@pytest.mark.parametrize("method", ["check", "tracking"])
def test_a_call_cancelled_between_check_and_tracking(
    asb: AsyncSandbox, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:  # fmt: skip
    """The call thread's side: the scope is cancelled after its check passed but before the execution is
    tracked (the late path), or just after. The call ends as a cancelled one: nothing committed or recorded."""
    log = CallLog(None)

    async def main() -> tuple[dict[str, Any], set[int]]:
        with scope_cancelled_after(monkeypatch, method) as fired:
            async with AsyncAgent.for_role("calc", provider=ScriptedProvider([SPIN_AFTER_WRITING]), sandbox=asb,
                                           log=log, context={"total": 1}) as calc:  # fmt: skip
                before = workers(asb.sandbox)
                task = asyncio.create_task(calc.call("spin"))
                await cancelled(task)
                assert fired
                return calc.context, await gone(workers(asb.sandbox) - before)

    context, left = run(main())
    assert context == {"total": 1} and not left
    assert log.records == []


def test_closing_a_workspace_cancels_its_running_call(asb: AsyncSandbox) -> None:
    """Leaving ``async with`` while a call still runs (the test body raised, say) must not wait for the
    program's own time limit: the call is cancelled, nothing is committed, later calls are refused."""
    log = CallLog(None)

    async def main() -> tuple[dict[str, Any], set[int]]:
        calc = AsyncAgent.for_role("calc", provider=ScriptedProvider([SPIN_AFTER_WRITING]), sandbox=asb, log=log,
                                   context={"total": 1})  # fmt: skip
        before = workers(asb.sandbox)
        task = asyncio.create_task(calc.call("spin"))
        for _ in range(6000):  # the program is running (its worker, pid 1 of its namespace, is there)
            if len(alive(workers(asb.sandbox) - before)) >= 1:
                break
            await asyncio.sleep(0.01)
        async with asyncio.timeout(GUARD_S):
            await calc.aclose()
        await cancelled(task)
        with pytest.raises(CallsClosed):
            await calc.call("spin")
        return calc.context, await gone(workers(asb.sandbox) - before)

    context, left = run(main())
    assert context == {"total": 1} and not left
    assert log.records == []
