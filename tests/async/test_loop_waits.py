"""What the async driver waits for without a thread: a worker's exit report (the zygote's reader wakes the
loop) and clean-up handed off (``Detach``: the outcome is not held back for it, a close waits for it)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import AsyncSandbox, ExecutionRequest, Limits, Sandbox, SandboxConfig, leftovers
from sandforge.sandbox.aio import Threads, drive
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.steps import Blocking, Detach, Steps, run_steps


def _detaching(cleanup: Callable[[], None]) -> Steps[str]:
    yield Detach(cleanup)
    return "outcome"


def test_detached_cleanup_does_not_hold_the_outcome_and_a_close_waits_for_it() -> None:
    release, done = threading.Event(), threading.Event()

    def cleanup() -> None:
        assert release.wait(30)
        done.set()

    threads = Threads(short=1, long=1)

    async def main() -> str:
        return await drive(_detaching(cleanup), threads)

    assert asyncio.run(main()) == "outcome" and not done.is_set()  # returned while the clean-up still waits
    release.set()
    threads.shutdown()  # waits for it: nothing handed off outlives the close
    assert done.is_set()


def test_the_sync_driver_cleans_up_in_place() -> None:
    seen: list[str] = []
    assert run_steps(_detaching(lambda: seen.append("cleaned"))) == "outcome" and seen == ["cleaned"]


def test_a_blocking_step_with_a_loop_form_is_awaited_on_the_loop_and_run_in_place_when_sync() -> None:
    where: list[str] = []

    async def on_loop() -> str:
        where.append("loop")
        return "answer"

    def steps() -> Steps[str]:
        answer = yield Blocking(lambda: where.append("thread") or "answer", on_loop=on_loop)
        return str(answer)

    threads = Threads(short=1, long=1)

    async def main() -> str:
        return await drive(steps(), threads)

    try:
        assert asyncio.run(main()) == "answer" and where == ["loop"]
    finally:
        threads.shutdown()
    assert run_steps(steps()) == "answer" and where == ["loop", "thread"]


def test_the_exit_report_wakes_the_loop_and_a_timeout_or_a_dead_zygote_ends_the_wait() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0))
    try:
        limits = Limits()
        zygote_of: Any = backend._zygotes
        worker = backend.spawn(limits)
        zygote = zygote_of[limits]

        async def main() -> tuple[Any, Any]:
            early = await zygote.exit_report(worker.pid, 0.05)  # still running: none within the timeout
            os.killpg(worker.pid, signal.SIGKILL)
            return early, await zygote.exit_report(worker.pid, 30)

        early, report = asyncio.run(main())
        assert early is None and report is not None and report["pid"] == worker.pid
        worker._reaped = True  # its report was taken here
        worker.destroy()

        other = backend.spawn(limits)

        async def orphaned() -> Any:
            waiting = asyncio.create_task(zygote.exit_report(other.pid, 60))
            await asyncio.sleep(0.05)
            zygote.close()  # the zygote goes away: the waiter is woken, not left for its timeout
            return await asyncio.wait_for(waiting, 30)

        assert asyncio.run(orphaned()) is None
        other.destroy()
    finally:
        backend.close()


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
def test_awaited_executions_leave_no_work_directory_after_close(zygote: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Path] = []
    real = leftovers.new_workdir

    def spy() -> Path:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(leftovers, "new_workdir", spy)

    async def main() -> list[Any]:
        with Sandbox(SandboxConfig(pool_size=1, zygote=zygote)) as sb:
            async with AsyncSandbox(sb) as asb:
                return [await asb.execute(ExecutionRequest(code="return 6 * 7")) for _ in range(5)]

    assert [o.value for o in asyncio.run(main())] == [42] * 5
    # one directory, the backend's mount point for every worker's private root (``SubprocessBackend.mount_point``)
    assert len(made) >= 1 and [p for p in made if p.exists()] == []
