"""The warm pool's refill wake-ups cost the loop little: a hand-out wakes the refill thread only when it may be
asleep, a start that leaves nothing missing does not wake it again, and ``acquire_async`` with a ``refill``
hook defers the replacement's start until the execution has answered when the pool has slack (another worker
ready, callers further apart than two starts take), but not back to back nor for the last ready worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sandforge.sandbox.pool import WarmPool
from tests.sandbox.test_pool import FakeWorker


class _Counted:
    """Counts the pool's wake-ups (its ``_nudge``), calling through."""

    def __init__(self, pool: WarmPool) -> None:
        self.calls = 0
        self.inner = pool._nudge

    def __call__(self) -> None:
        self.calls += 1
        self.inner()


def _full_pool(size: int = 2) -> tuple[WarmPool, _Counted]:
    pool = WarmPool(FakeWorker, size=size, idle_s=600, name="t")  # type: ignore[arg-type]
    assert pool.wait_ready(size, timeout=10)
    counted = _Counted(pool)
    pool._nudge = counted  # type: ignore[method-assign]
    return pool, counted


def _wait_idle(pool: WarmPool) -> None:
    deadline = time.monotonic() + 10
    while not (pool._idle and pool.ready_count() == pool.size and pool._in_flight == 0):
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_hand_out_wakes_the_sleeping_refill_once_and_the_start_does_not_wake_it_again() -> None:
    pool, counted = _full_pool()
    try:
        _wait_idle(pool)
        pool.acquire()
        assert counted.calls == 1
        assert pool.wait_ready(2, timeout=10)
        _wait_idle(pool)
        assert counted.calls == 1  # the start left nothing missing: no second wake-up
    finally:
        pool.close()


def test_a_hand_out_while_the_refill_thread_is_awake_does_not_wake_it() -> None:
    pool, counted = _full_pool()
    try:
        _wait_idle(pool)
        pool._idle = False  # as between its wake-up and its next count (which sees this hand-out)
        pool.acquire()
        assert counted.calls == 0
        pool._idle = True
    finally:
        pool.close()


def _acquire(pool: WarmPool, owed: list[Callable[[], None]]) -> None:
    async def take() -> None:
        await pool.acquire_async(refill=owed.append)

    asyncio.run(take())


def test_with_slack_the_replacement_waits_for_the_execution_to_answer() -> None:
    pool, counted = _full_pool()
    try:
        _wait_idle(pool)
        pool.last_used = time.monotonic() - 60  # the last caller came long ago
        owed: list[Callable[[], None]] = []
        _acquire(pool, owed)
        assert counted.calls == 0 and owed == [pool._start_missing]  # handed to the clean-up hand-over, not called
        owed[0]()  # the caller submits the start itself: the refill thread is not woken for it
        assert pool.wait_ready(2, timeout=10)
        assert counted.calls == 0
    finally:
        pool.close()


def test_back_to_back_or_the_last_ready_one_the_replacement_starts_at_once() -> None:
    pool, counted = _full_pool()
    try:
        _wait_idle(pool)
        pool.last_used = time.monotonic()  # a caller just came: no slack
        owed: list[Callable[[], None]] = []
        _acquire(pool, owed)
        assert owed == [] and counted.calls == 1  # one missing: its start leaves nothing to wake it for
        assert pool.wait_ready(2, timeout=10)
        _wait_idle(pool)
        pool.last_used = time.monotonic() - 60
        with pool._lock:
            pool._ready.pop().destroy()  # one ready left: taking it leaves none for the next caller
        _acquire(pool, owed)
        assert owed == [] and counted.calls >= 2  # woken now (its starts may wake it again: two are missing)
    finally:
        pool.close()
