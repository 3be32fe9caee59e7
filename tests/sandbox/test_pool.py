"""WarmPool mechanics with a stand-in worker factory (the backends' own pools are tested per backend)."""

from __future__ import annotations

import threading
import time

from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.pool import WarmPool
from sandforge.sandbox.protocol import Limits


class FakeWorker:
    backend = "fake"
    limits = Limits()
    protections: dict[str, bool] = {}

    def __init__(self) -> None:
        self.created_at = time.monotonic()
        self.destroyed = False

    def alive(self) -> bool:
        return not self.destroyed

    def execute(self, request: object, bridge: object) -> object:
        raise NotImplementedError

    def destroy(self) -> None:
        self.destroyed = True


class SlowFactory:
    """Counts how many starts overlap."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.made: list[FakeWorker] = []

    def __call__(self) -> FakeWorker:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
            worker = FakeWorker()
            self.made.append(worker)
        return worker


def test_refill_starts_workers_concurrently_up_to_the_limit() -> None:
    factory = SlowFactory(0.2)
    pool = WarmPool(factory, size=6, idle_s=60, name="t", concurrency=3)  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(6, timeout=10)
        assert factory.max_running == 3
    finally:
        pool.close()
    assert all(w.destroyed for w in factory.made)


def test_one_at_a_time_when_concurrency_is_one() -> None:
    factory = SlowFactory(0.05)
    pool = WarmPool(factory, size=3, idle_s=60, name="t", concurrency=1)  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(3, timeout=10)
        assert factory.max_running == 1
    finally:
        pool.close()


def test_each_worker_is_handed_out_once_and_replaced() -> None:
    factory = SlowFactory(0.0)
    pool = WarmPool(factory, size=2, idle_s=60, name="t", concurrency=2)  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(2, timeout=10)
        taken = [pool.acquire() for _ in range(5)]
        assert len({id(w) for w in taken}) == 5
        assert pool.wait_ready(2, timeout=10)
    finally:
        pool.close()


def test_idle_workers_are_replaced_not_handed_out() -> None:
    factory = SlowFactory(0.0)
    pool = WarmPool(factory, size=1, idle_s=0.2, name="t", concurrency=1)  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(1, timeout=10)
        first = pool._ready[0]
        time.sleep(0.5)
        worker = pool.acquire()
        assert worker is not first and first.destroyed
    finally:
        pool.close()


def test_engine_down_backs_off_and_recovers() -> None:
    attempts: list[float] = []
    healthy = threading.Event()

    def flaky() -> FakeWorker:
        attempts.append(time.monotonic())
        if not healthy.is_set():
            raise SandboxUnavailable("engine down")
        return FakeWorker()

    pool = WarmPool(flaky, size=1, idle_s=60, name="t", concurrency=2)  # type: ignore[arg-type]
    try:
        time.sleep(1.0)
        assert pool.ready_count() == 0 and pool.last_error == "engine down"
        assert len(attempts) < 30  # backed off, not a tight loop
        healthy.set()
        assert pool.wait_ready(1, timeout=15)
        assert pool.last_error is None
    finally:
        pool.close()


def test_a_worker_handed_to_a_loop_that_never_runs_again_is_destroyed_at_close() -> None:
    """A start finishing for an awaiting caller is delivered on the caller's loop; when that loop stops before
    running the delivery, the worker is neither ready nor handed out: ``close`` still destroys it."""
    import asyncio

    pool = WarmPool(FakeWorker, size=0, idle_s=60, name="t")  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    waiter: asyncio.Future[object] = loop.create_future()
    pool._waiters.append((loop, waiter))  # type: ignore[arg-type]  # what acquire_async registers
    worker = FakeWorker()
    pool._hand_over(worker)  # type: ignore[arg-type]  # queued on the loop, which never runs again
    loop.close()
    assert not worker.destroyed
    pool.close()
    assert worker.destroyed


def test_a_delivery_after_close_gives_the_waiter_the_closed_pools_error() -> None:
    """The close destroyed the worker on its way: the waiter, if its loop still runs, gets a typed error, never
    a destroyed worker and never an endless wait."""
    import asyncio

    async def main() -> BaseException | None:
        pool = WarmPool(FakeWorker, size=0, idle_s=60, name="t")  # type: ignore[arg-type]
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        pool._waiters.append((asyncio.get_running_loop(), waiter))  # type: ignore[arg-type]
        worker = FakeWorker()
        pool._hand_over(worker)  # type: ignore[arg-type]  # the delivery waits for this loop's next turn
        pool.close()  # before that turn
        assert worker.destroyed
        try:
            await asyncio.wait_for(waiter, 5)
        except SandboxUnavailable as exc:
            return exc
        return None

    assert isinstance(asyncio.run(main()), SandboxUnavailable)


def test_a_sync_hand_out_defers_the_refill_only_while_a_spare_stays_ready() -> None:
    """``acquire(refill)`` hands the refill's wake-up to its caller (to run once the execution has answered)
    while another worker is still ready; the last ready worker's hand-out wakes the refill at once."""
    factory = SlowFactory(0.0)
    pool = WarmPool(factory, size=2, idle_s=60, name="t", concurrency=2)  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(2, timeout=10)
        owed: list[object] = []
        first = pool.acquire(owed.append)
        assert len(owed) == 1  # a spare is ready: the replacement waits for the caller
        last: list[object] = []
        second = pool.acquire(last.append)
        assert last == []  # none left: refilled now, not owed
        assert first is not second
        for nudge in owed:
            nudge()  # type: ignore[operator]
        assert pool.wait_ready(2, timeout=10)
    finally:
        pool.close()
