"""Detached clean-ups go to one long-lived clean-up thread through a queue (no ``Executor.submit``, no ``Future``
per execution), gathered per loop iteration; the short pool takes a batch only while that thread is busy, so
clean-ups still run side by side under load. ``after_run`` calls (a warm pool's deferred refill) go first in
the next hand-over, which the end of a drive schedules even when nothing was detached."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from sandforge.sandbox.aio import Threads, drive
from sandforge.sandbox.steps import Steps

GUARD_S = 30.0


def _recorder(names: list[str], done: threading.Event | None = None) -> Callable[[], None]:
    def record() -> None:
        names.append(threading.current_thread().name)
        if done is not None:
            done.set()

    return record


def test_clean_ups_of_successive_executions_run_on_one_thread_and_start_no_pool_thread() -> None:
    async def scenario() -> list[str]:
        threads = Threads(short=2, long=1)
        loop = asyncio.get_running_loop()
        names: list[str] = []
        for _ in range(5):
            done = threading.Event()
            threads.detach(_recorder(names, done), loop=loop)
            await asyncio.sleep(0)
            assert await asyncio.to_thread(done.wait, GUARD_S)
        assert threads.short._threads == set()  # nothing was submitted to the pool
        await threads.shutdown_async()
        return names

    names = asyncio.run(scenario())
    assert names == ["sandforge-aio-cleanup"] * 5


def test_the_clean_ups_of_one_iteration_are_handed_over_together_in_order() -> None:
    async def scenario() -> list[int]:
        threads = Threads(short=1, long=1)
        loop = asyncio.get_running_loop()
        order: list[int] = []
        for i in range(4):
            threads.detach(lambda i=i: order.append(i), loop=loop)  # type: ignore[misc]
        scheduled = [h for h in loop._ready if "_hand_over" in repr(h)]  # type: ignore[attr-defined]
        assert len(scheduled) == 1  # one hand-over for the whole iteration
        await threads.shutdown_async()
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_while_the_clean_up_thread_is_busy_a_batch_runs_on_the_short_pool_beside_it() -> None:
    async def scenario() -> tuple[str, bool]:
        threads = Threads(short=1, long=1)
        loop = asyncio.get_running_loop()
        release = threading.Event()
        threads.detach(lambda: release.wait(GUARD_S), loop=loop)  # holds the clean-up thread
        await asyncio.sleep(0)
        names: list[str] = []
        done = threading.Event()
        threads.detach(_recorder(names, done), loop=loop)
        await asyncio.sleep(0)
        ran_beside = await asyncio.to_thread(done.wait, GUARD_S)  # while the first still holds its thread
        release.set()
        await threads.shutdown_async()
        return names[0], ran_beside

    name, ran_beside = asyncio.run(scenario())
    assert ran_beside and name.startswith("sandforge-aio_")


def test_after_run_calls_go_first_in_the_next_hand_over_and_a_drive_delivers_them_without_a_clean_up() -> None:
    def steps() -> Steps[int]:
        return 7
        yield  # a generator without a single wait

    async def scenario() -> tuple[list[str], int]:
        threads = Threads(short=1, long=1)
        names: list[str] = []
        done = threading.Event()
        threads.after_run(_recorder(names, done))
        assert names == []  # not now, on the loop's thread
        value = await drive(steps(), threads)
        assert names == []  # not before the step that returned the value ended
        await asyncio.sleep(0)
        assert await asyncio.to_thread(done.wait, GUARD_S)
        await threads.shutdown_async()
        return names, value

    names, value = asyncio.run(scenario())
    assert value == 7 and names == ["sandforge-aio-cleanup"]


def test_an_after_run_call_owed_at_shutdown_is_run_by_it() -> None:
    threads = Threads(short=1, long=1)
    names: list[str] = []
    threads.after_run(_recorder(names))
    threads.shutdown()
    assert names == [threading.current_thread().name]
    threads.after_run(_recorder(names))  # after the stop: at once
    assert len(names) == 2
