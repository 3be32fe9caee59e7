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
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import CallLog
from sandforge.runtime.agent.awaited import CallScope
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import Limits, Sandbox, SandboxConfig

ADD = "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']"
GUARD_S = 120.0


def cancel_after_the_commit(monkeypatch: pytest.MonkeyPatch, task: list[asyncio.Task[Any]]) -> list[bool]:
    """On the call's thread, once its commit stood: cancel the awaiting task and wait until the loop has
    delivered that cancel (FIFO callbacks), before the call returns."""
    original = CallScope.committing
    accepted: list[bool] = []

    @contextlib.contextmanager
    def committing(self: CallScope) -> Iterator[None]:
        with original(self):
            yield
        delivered = threading.Event()

        def cancel() -> None:
            accepted.append(task[0].cancel())
            delivered.set()

        self.loop.call_soon_threadsafe(cancel)
        assert delivered.wait(GUARD_S)

    monkeypatch.setattr(CallScope, "committing", committing)
    return accepted


def test_a_cancel_that_comes_after_the_commit_gets_the_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=Limits(timeout_s=60)))
    log = CallLog(None)
    task: list[asyncio.Task[Any]] = []
    accepted = cancel_after_the_commit(monkeypatch, task)

    async def main() -> tuple[Any, dict[str, Any], int, bool]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([ADD]), sandbox=sb, log=log,
                                       context={"total": 1}) as calc:  # fmt: skip
            task.append(asyncio.create_task(calc.call("add", 3)))
            async with asyncio.timeout(GUARD_S):
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
