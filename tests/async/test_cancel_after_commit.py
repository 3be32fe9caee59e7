"""A cancel that reaches an awaited agent call after its commit stood (issue 24's contract, agent side).

Cancelling the caller's task is a request: the call's thread may be committing, or done committing, when the
task learns of it. Before any commit the call is stopped and nothing is kept (``test_cancel_sweep_agent.py``).
Once the commit stood it is not undone, and the task is still cancelled: the cancel is never swallowed
(``Task.uncancel``), because the task may have more to do after this call, and a cancel taken back there lets
it go on (the next call would run). This is the standard library's own choice for ``asyncio.wait_for``
(gh-86296: a result that arrives with the cancel is dropped, the cancel wins). The call's record (call log,
context) says what was kept, so a caller that must not apply a call twice checks it before retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import CallLog
from sandforge.runtime.agent.awaited import CallScope
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import Limits, Sandbox, SandboxConfig

ADD = "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']"
GUARD_S = 120.0


def after_the_commit(monkeypatch: pytest.MonkeyPatch, interrupt: Callable[[asyncio.AbstractEventLoop], None]) -> None:
    """On the call's thread, once its commit stood: ``interrupt`` the awaiting task on the loop, and wait until
    the loop has run what that scheduled (FIFO callbacks), before the call returns."""
    original = CallScope.committing

    @contextlib.contextmanager
    def committing(self: CallScope) -> Iterator[None]:
        with original(self):
            yield
        delivered = threading.Event()

        def on_loop() -> None:
            interrupt(self.loop)
            self.loop.call_soon(delivered.set)

        self.loop.call_soon_threadsafe(on_loop)
        assert delivered.wait(GUARD_S)

    monkeypatch.setattr(CallScope, "committing", committing)


def _run(
    monkeypatch: pytest.MonkeyPatch, how: str, calls: int
) -> tuple[BaseException | None, dict[str, Any], int, list[bool]]:
    """``calls`` calls of ``add(3)`` in one task; the first one's commit stands, then ``how`` interrupts it."""
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=Limits(timeout_s=60)))
    log = CallLog(None)
    task: list[asyncio.Task[Any]] = []
    timeouts: list[asyncio.Timeout] = []
    accepted: list[bool] = []

    def interrupt(loop: asyncio.AbstractEventLoop) -> None:
        if accepted:
            return  # only the first commit is interrupted
        if how == "cancel":
            accepted.append(task[0].cancel())
        else:
            timeouts[0].reschedule(loop.time())  # expires now: the timeout cancels the task
            accepted.append(True)

    after_the_commit(monkeypatch, interrupt)

    async def main() -> tuple[BaseException | None, dict[str, Any]]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([ADD]), sandbox=sb, log=log,
                                       context={"total": 1}) as calc:  # fmt: skip

            async def call() -> None:
                async with asyncio.timeout(GUARD_S) as timeout:
                    timeouts.append(timeout)
                    for _ in range(calls):
                        await calc.call("add", 3)

            task.append(asyncio.create_task(call()))
            try:
                await task[0]
            except (asyncio.CancelledError, TimeoutError) as exc:
                return exc, calc.context
            return None, calc.context

    try:
        error, context = asyncio.run(main())
    finally:
        sb.close()
    return error, context, len(log.records), accepted


@pytest.mark.parametrize(("how", "raised"), [("cancel", asyncio.CancelledError), ("timeout", TimeoutError)])
def test_a_cancel_after_the_commit_keeps_the_commit_and_still_cancels(
    monkeypatch: pytest.MonkeyPatch, how: str, raised: type[BaseException]
) -> None:
    """``cancel``: the caller's task is cancelled; ``timeout``: an ``asyncio.timeout`` around it expires (the
    caller gets the TimeoutError it asked for). The commit that stood is kept and recorded once."""
    error, context, records, accepted = _run(monkeypatch, how, calls=1)
    assert accepted == [True]  # the task had not finished: the cancel was a real one
    assert isinstance(error, raised)
    assert context == {"total": 4} and records == 1  # what was kept is on the record


def test_a_cancel_during_one_call_stops_the_calls_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task meant to stop: a cancel that came during the first call's commit must not let the second run
    (it would, if the first call swallowed the cancel to return its outcome)."""
    error, context, records, accepted = _run(monkeypatch, "cancel", calls=2)
    assert accepted == [True]
    assert isinstance(error, asyncio.CancelledError)
    assert context == {"total": 4} and records == 1  # the first call only
