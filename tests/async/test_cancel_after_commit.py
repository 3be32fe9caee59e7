"""A cancel that reaches an awaited agent call after its commit stood (issue 24's contract, agent side).

Cancelling the caller's task is a request: the call's thread may be committing, or done committing, when the
task learns of it. Before any commit the call is stopped and nothing is kept (``test_cancel_sweep_agent.py``).
Once the commit stood it is not undone, so the caller must not be told the call was cancelled: a
``CancelledError`` there read as "nothing happened", and a retry applied the call twice. The call returns its
outcome instead (the cancel came too late for it, as for a task that finished first); ``CancelledError``
always means nothing of the call was committed.
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


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_cancel_that_comes_after_the_commit_gets_the_outcome(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """``cancel``: the caller's task is cancelled; ``timeout``: an ``asyncio.timeout`` around the call expires
    (it must not turn a kept call into a TimeoutError either)."""
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=Limits(timeout_s=60)))
    log = CallLog(None)
    task: list[asyncio.Task[Any]] = []
    timeouts: list[asyncio.Timeout] = []
    accepted: list[bool] = []

    def interrupt(loop: asyncio.AbstractEventLoop) -> None:
        if how == "cancel":
            accepted.append(task[0].cancel())
        else:
            timeouts[0].reschedule(loop.time())  # expires now: the timeout cancels the task
            accepted.append(True)

    after_the_commit(monkeypatch, interrupt)

    async def main() -> tuple[Any, dict[str, Any], int, bool]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([ADD]), sandbox=sb, log=log,
                                       context={"total": 1}) as calc:  # fmt: skip

            async def call() -> Any:
                async with asyncio.timeout(GUARD_S) as timeout:
                    timeouts.append(timeout)
                    return await calc.call("add", 3)

            task.append(asyncio.create_task(call()))
            outcome = await task[0]
            return outcome, calc.context, task[0].cancelling(), task[0].cancelled()

    try:
        outcome, context, cancelling, cancelled = asyncio.run(main())
    finally:
        sb.close()
    assert accepted == [True]  # the task had not finished: the cancel was a real one
    assert outcome.value == 4 and context == {"total": 4}  # what the caller is told is what was kept
    assert len(log.records) == 1
    assert not cancelled and cancelling == 0  # the cancellation was taken back (``uncancel``), not left pending
