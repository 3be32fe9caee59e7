"""A worker's clean-up handed off by the awaited drive starts at the loop's next iteration, after what the
awaiting step still does with the outcome (``POST /v1/exec`` answers first), and still never outlives a close:
a shutdown that comes before that iteration runs it itself, exactly once."""

from __future__ import annotations

import asyncio
import threading

from sandforge.sandbox.aio import Threads


class _Cleanup:
    def __init__(self) -> None:
        self.threads: list[str] = []
        self.ran = threading.Event()

    def __call__(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.ran.set()


def test_the_hand_off_waits_for_the_next_iteration_then_runs_on_the_pool() -> None:
    async def scenario() -> None:
        threads = Threads(short=1, long=1)
        cleanup = _Cleanup()
        threads.detach(cleanup, loop=asyncio.get_running_loop())
        assert not cleanup.ran.wait(0.2)  # this step goes on first: nothing was submitted yet
        await asyncio.sleep(0)
        assert await asyncio.to_thread(cleanup.ran.wait, 10)
        await threads.shutdown_async()
        assert len(cleanup.threads) == 1 and cleanup.threads[0].startswith("sandforge-aio")

    asyncio.run(scenario())


def test_a_shutdown_in_the_same_step_runs_the_queued_clean_up_once() -> None:
    async def scenario() -> None:
        threads = Threads(short=1, long=1)
        cleanup = _Cleanup()
        threads.detach(cleanup, loop=asyncio.get_running_loop())
        threads.shutdown()  # blocking, before the loop ran again: it must not wait for that iteration
        assert cleanup.threads == [threading.current_thread().name]
        await asyncio.sleep(0)  # the queued hand-off finds nothing left to start
        await asyncio.sleep(0)
        assert len(cleanup.threads) == 1

    asyncio.run(scenario())


def test_an_async_shutdown_in_the_same_step_waits_for_the_clean_up() -> None:
    async def scenario() -> None:
        threads = Threads(short=1, long=1)
        cleanups = [_Cleanup() for _ in range(3)]
        loop = asyncio.get_running_loop()
        for cleanup in cleanups:
            threads.detach(cleanup, loop=loop)
        await threads.shutdown_async()
        assert all(len(c.threads) == 1 for c in cleanups)

    asyncio.run(scenario())


def test_a_hand_off_after_the_shutdown_runs_in_place() -> None:
    async def scenario() -> None:
        threads = Threads(short=1, long=1)
        await threads.shutdown_async()
        cleanup = _Cleanup()
        threads.detach(cleanup, loop=asyncio.get_running_loop())
        assert cleanup.threads == [threading.current_thread().name]

    asyncio.run(scenario())


def test_a_closed_loop_gets_the_clean_up_submitted_at_once() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    threads = Threads(short=1, long=1)
    cleanup = _Cleanup()
    threads.detach(cleanup, loop=loop)
    assert cleanup.ran.wait(10)
    threads.shutdown()
    assert len(cleanup.threads) == 1
