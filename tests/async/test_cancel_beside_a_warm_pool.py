"""The window of issue 24's last flake: another sandbox's warm pool starts a worker while a call is cancelled.

The cancellation test counted "its" processes as every sandbox process that appeared after it began. The
module's shared sandbox (a warm pool of two) refills on its own threads after the tests that drained it; under
load its new worker appeared after the test's snapshot, was taken for the call's, and, rightly, never ended: it
waits, warm, for a request. Here that start is held at a gate and released inside the window, every time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import CallLog
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import Limits, Sandbox, SandboxConfig

from .procs import alive, gone, wait_for_new, workers

LONG = Limits(timeout_s=600)
SPIN_AFTER_WRITING = "context['total'] = 999\nwhile True:\n    pass"
GUARD_S = 120.0


def test_a_warm_worker_started_meanwhile_by_another_pool_is_not_the_cancelled_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = threading.Event()
    warm = Sandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=LONG))
    cold = Sandbox(SandboxConfig(backend="subprocess", pool_size=0, limits=LONG))
    backend = warm._backend("subprocess")
    spawn = backend.spawn

    def gated(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(GUARD_S)
        return spawn(*args, **kwargs)

    monkeypatch.setattr(backend, "spawn", gated)
    pool = warm.pool()  # its refill thread's first start waits at the gate
    log = CallLog(None)

    async def main() -> tuple[dict[str, Any], set[int], set[int], set[int]]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([SPIN_AFTER_WRITING]), sandbox=cold,
                                       log=log, context={"total": 1}) as calc:  # fmt: skip
            everyone, mine = workers(), workers(cold)
            gate.set()  # the warm pool's worker starts after both snapshots: new to a count of every sandbox
            assert await asyncio.get_running_loop().run_in_executor(None, pool.wait_ready, 1, GUARD_S)
            task = asyncio.create_task(calc.call("spin"))
            running = await wait_for_new(mine, cold)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            left = await gone(running | workers(cold))
            return calc.context, running, left, alive(workers() - everyone)

    try:
        context, running, left, new_anywhere = asyncio.run(main())
        assert context == {"total": 1} and log.records == []
        assert running and not left  # the call's own worker ended, and the cancellation left none of cold's
        # What the unscoped count saw: a process new since the call began, alive after it ended, not the call's.
        # It is the warm pool's worker, waiting for a request, as it should.
        assert new_anywhere and not new_anywhere & running
        assert pool.ready_count() == 1
    finally:
        gate.set()
        warm.close()
        cold.close()
