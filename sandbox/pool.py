"""Warm pools: workers are started ahead so a call rarely pays start-up cost.

A worker is handed out at most once and destroyed after its single execution; the pool only hides the
start-up latency, it never reuses a sandbox. Members that died, or sat idle longer than ``idle_s``, are
destroyed and replaced, never handed out. A pool given ``retire_idle_s`` (one per environment) retires when
nothing was acquired from it for that long: it stops refilling, destroys what it holds, and its owner drops
it (``Sandbox``), so the warm workers of environments no longer used do not sit there forever.

``acquire_async`` is the same hand-out for the async API: when no worker is ready it does not start one on a
thread of its own (``acquire`` does, in its caller's); it waits on the event loop for the next worker the pool's
own spawn threads start (``concurrency`` of them, up to ``waiting_concurrency`` while async callers wait: the sync
``acquire`` starts one per waiting caller), so many awaiting callers hold no thread each. A waiter whose
task is cancelled gives its worker to the next waiter (or back to the ready set); a failed start fails the
oldest waiter with the error ``acquire`` would have raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING

from sandforge.sandbox.backends.base import Worker
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.prestart import prestart

if TYPE_CHECKING:  # the async API's asyncio loads with its first awaited acquire (``acquire_async``)
    import asyncio

log = logging.getLogger(__name__)

#: Starts at once while async callers wait for a worker (``WarmPool.waiting_concurrency``).
WAITING_CONCURRENCY = 16


class WarmPool:
    def __init__(
        self, spawn: Callable[[], Worker], *, size: int, idle_s: float, name: str, concurrency: int = 1,
        retire_idle_s: float | None = None, waiting_concurrency: int = WAITING_CONCURRENCY,
        prestart_threads: bool = False,
    ) -> None:  # fmt: skip
        self._spawn = spawn
        self.size = size
        self.concurrency = max(1, concurrency)
        #: starts at once while ``acquire_async`` callers wait (they have no thread of their own to start one on)
        self.waiting_concurrency = max(self.concurrency, waiting_concurrency)
        self._in_flight = 0
        self._backoff = 0.05
        self.idle_s = idle_s
        self.name = name
        self._ready: deque[Worker] = deque()
        self._lock = threading.Lock()
        #: the refill thread's wake-up: held while none is pending (``_nudge`` releases it, the thread's wait takes
        #: it). A bare lock: releasing it costs the caller (the event loop, on every hand-out) no ``Condition``.
        self._wake = threading.Lock()
        self._wake.acquire()
        #: whether the refill thread may be waiting (set before it counts what is missing): a hand-out nudges it
        #: only then; one that comes while it works is seen by its next count
        self._idle = False
        self._last_reap = time.monotonic()
        #: how long a worker's start takes (a moving average of the refill's own starts, in seconds)
        self._start_s = 0.05
        self._closed = False
        self.retire_idle_s = retire_idle_s
        #: start all ``waiting_concurrency`` spawn threads at once (a service's thread count stays flat)
        self.prestart_threads = prestart_threads
        self.last_used = time.monotonic()
        self.retired = False
        self.last_error: str | None = None
        self.stats = {"warm_hits": 0, "cold_starts": 0, "replaced": 0, "waited": 0}
        #: async callers waiting for the next started worker, oldest first (``acquire_async``)
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[Worker]]] = deque()
        #: workers on their way to a waiter's loop (by id): a loop that stops before delivering leaves them
        #: here, and ``close`` destroys them with the ready ones
        self._transit: dict[int, Worker] = {}
        self._thread: threading.Thread | None = None
        #: the refill thread's spawn threads while it runs (``_start_missing`` submits to them too)
        self._spawner: Executor | None = None
        if size > 0:
            self._thread = threading.Thread(target=self._refill_loop, name=f"sandforge-pool-{name}", daemon=True)
            self._thread.start()

    def acquire(self, refill: Callable[[Callable[[], None]], None] | None = None) -> Worker:
        """A ready worker that has never run anything; spawns one cold when none is waiting. ``refill``
        (``Sandbox.execute``'s, called once the execution has answered) defers the taken worker's
        replacement while another worker stays ready: its start (a fork and a lock-down, CPU on the same
        cores) then does not compete with this execution, and the next caller still gets a warm one. With
        none left ready, the refill wakes now."""
        self.last_used = time.monotonic()
        worker = self._take_ready(nudge=refill is None)
        if worker is not None:
            if refill is not None:
                if self._ready:  # a read without the lock: at worst one replacement starts now, or later
                    refill(self._start_missing)
                elif self._idle:
                    self._nudge()
            return worker
        self.stats["cold_starts"] += 1
        self._nudge()
        worker = self._spawn()
        self.last_used = time.monotonic()  # a slow first start (an environment zygote's import) is not idleness
        return worker

    async def acquire_async(
        self, executor: Executor | None = None, refill: Callable[[Callable[[], None]], None] | None = None
    ) -> Worker:
        """``acquire`` for the event loop: a ready worker, else the next one the pool's spawn threads start
        (waiting holds no thread). A pool that keeps none warm (``size`` 0, or closed) starts one cold on
        ``executor`` (default: the loop's). Raises SandboxUnavailable as ``acquire`` does. ``refill`` (the
        async API's ``Threads.after_run``) defers the taken worker's replacement until the execution has
        answered (its start then does not compete with the execution for the CPU and the loop's thread) when
        the pool has slack: another worker is still ready, and callers come further apart than two starts
        take (:meth:`_slack`). Otherwise (back to back, the last one taken, none ready) the refill wakes now."""
        previous, self.last_used = self.last_used, time.monotonic()
        deferred = refill if refill is not None and self._slack(self.last_used - previous) else None
        worker = self._take_ready(nudge=deferred is None)
        if worker is not None:
            if deferred is not None:
                if self._ready:  # a read without the lock: at worst one replacement starts now, or after this run
                    deferred(self._start_missing)
                elif self._idle:
                    self._nudge()
            return worker
        import asyncio

        from sandforge.sandbox.aio import unless_cancelled

        loop = asyncio.get_running_loop()
        if self._thread is None or self._closed:
            self.stats["cold_starts"] += 1
            started: Worker = await unless_cancelled(loop.run_in_executor(executor, self._spawn), executor)
            return started
        waiter: asyncio.Future[Worker] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, waiter))
        self.stats["waited"] += 1
        self._nudge()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._hand_over(waiter.result())  # handed to us just as we were cancelled: the next waiter's
            raise

    def _slack(self, interval: float) -> bool:
        """Whether a replacement started after this execution is ready before the next caller comes (judging by
        the last interval between callers): it then starts after the execution, not during it."""
        return interval > 2 * self._start_s

    def _take_ready(self, nudge: bool = True) -> Worker | None:
        while True:
            with self._lock:
                worker = self._ready.popleft() if self._ready else None
            if worker is None:
                return None
            if nudge and self._idle:  # a flag read: an awake refill thread counts this hand-out anyway
                self._nudge()
            if self._usable(worker):
                self.stats["warm_hits"] += 1
                return worker
            self._discard(worker)

    def _nudge(self) -> None:
        """Wake the refill thread (at most one wake-up pending)."""
        with contextlib.suppress(RuntimeError):  # released already: a wake-up is pending
            self._wake.release()

    def _start_missing(self) -> None:
        """A deferred refill (``acquire``'s ``refill``), run by the caller once its execution has answered: the
        missing starts go to the spawn threads from here, with no wake-up of the refill thread in between (a
        thread hand-off costs tens of microseconds of CPU, more under load). Without spawn threads yet, or
        closing, the refill thread is woken as before."""
        spawner = self._spawner
        if spawner is None or self._closed:
            self._nudge()
            return
        starts = self._claim_starts()
        try:
            for _ in range(starts):
                spawner.submit(self._start_one)
                starts -= 1
        except RuntimeError:  # shut down meanwhile (``close``): those starts are not coming
            with self._lock:
                self._in_flight -= starts

    def _claim_starts(self) -> int:
        """How many starts are missing now (counted as in flight from here)."""
        with self._lock:
            self._waiters = deque(w for w in self._waiters if not w[1].done())
            missing = self.size + len(self._waiters) - len(self._ready) - self._in_flight
            cap = self.waiting_concurrency if self._waiters else self.concurrency
            starts = max(0, min(missing, cap - self._in_flight))
            self._in_flight += starts
        return starts

    def _sleep(self, timeout: float) -> None:
        """The refill thread's wait: until nudged (taking the wake-up) or ``timeout``."""
        self._wake.acquire(timeout=timeout)

    def _hand_over(self, worker: Worker) -> None:
        """A started (or given back) worker: to the oldest live waiter, else into the ready set. Holds the lock
        only to choose; the waiter's future is set on its own loop."""
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                if not waiter.done() and not loop.is_closed():
                    break
            else:
                if not self._closed:
                    self._ready.append(worker)
                    return
                loop = None
            if loop is not None:
                self._transit[id(worker)] = worker
        if loop is None:
            worker.destroy()  # the pool closed meanwhile
            return
        try:
            loop.call_soon_threadsafe(self._deliver, waiter, worker)
        except RuntimeError:  # the loop closed between the check and the call
            with self._lock:
                self._transit.pop(id(worker), None)
            self._hand_over(worker)

    def _deliver(self, waiter: asyncio.Future[Worker], worker: Worker) -> None:
        """On the waiter's loop: its worker, unless it was cancelled meanwhile (then the next waiter's), or
        the pool closed meanwhile (``close`` destroyed it: the waiter gets the closed pool's error)."""
        with self._lock:
            mine = self._transit.pop(id(worker), None) is not None
        if not mine:
            _set_exception(waiter, SandboxUnavailable(f"the warm pool {self.name} was closed", retriable=True))
        elif waiter.done():
            self._hand_over(worker)
        else:
            waiter.set_result(worker)

    def _drain(self) -> list[Worker]:
        """Take the ready workers and the ones still on their way to a loop (to destroy them)."""
        with self._lock:
            workers = [*self._ready, *self._transit.values()]
            self._ready, self._transit = deque(), {}
        return workers

    def _fail_waiter(self, exc: BaseException, *, every: bool = False) -> None:
        """A start failed (the oldest waiter gets the error ``acquire`` would raise), or the pool closed."""
        with self._lock:
            failed = list(self._waiters) if every else ([self._waiters.popleft()] if self._waiters else [])
            if every:
                self._waiters.clear()
        for loop, waiter in failed:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(_set_exception, waiter, exc)

    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)

    def wait_ready(self, count: int | None = None, timeout: float = 30.0) -> bool:
        """Block until ``count`` (default: the pool size) workers are ready; for benchmarks and tests."""
        want = self.size if count is None else count
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_count() >= want:
                return True
            time.sleep(0.005)
        return False

    def _usable(self, worker: Worker) -> bool:
        return worker.alive() and time.monotonic() - worker.created_at < self.idle_s

    def _discard(self, worker: Worker) -> None:
        self.stats["replaced"] += 1
        with contextlib.suppress(Exception):
            worker.destroy()

    def _refill_loop(self) -> None:
        """Keep ``size`` workers ready, starting up to ``concurrency`` of them at once.

        Container engines overlap container starts, so one-at-a-time refill would cap the warm supply at
        1 / (start time) however much capacity the engine has left.
        """
        most = self.waiting_concurrency  # threads are made as starts need them: ``concurrency`` unless callers wait
        with ThreadPoolExecutor(max_workers=most, thread_name_prefix=f"sandforge-spawn-{self.name}") as ex:
            if self.prestart_threads:
                prestart(ex)
            self._spawner = ex
            try:
                while not self._closed:
                    if self._retire_due():
                        self._retire()
                        return
                    self._idle = True  # before the count: a hand-out after it nudges
                    self._reap_if_due()
                    for _ in range(self._claim_starts()):
                        ex.submit(self._start_one)
                    self._sleep(self._period())
                    self._idle = False
            finally:
                self._spawner = None

    def _start_one(self) -> None:
        began = time.monotonic()
        try:
            worker = self._spawn()
        except SandboxUnavailable as exc:
            self.last_error = str(exc)
            log.warning("pool %s cannot start a worker: %s", self.name, exc)
            if not exc.retriable:  # e.g. required protections missing: this machine will not change soon
                self._backoff = 5.0
            self._fail_waiter(exc)
            time.sleep(self._backoff)  # engine down: retry slowly, not in a tight loop
            self._backoff = min(self._backoff * 2, 5.0)
            worker = None
        except Exception:  # a bug must not kill the refill silently
            log.exception("pool %s: unexpected error starting a worker", self.name)
            time.sleep(1.0)
            worker = None
        else:
            self._backoff = 0.05
            self.last_error = None
            self._start_s += (time.monotonic() - began - self._start_s) * 0.25
        with self._lock:
            self._in_flight -= 1
        if worker is not None:
            self._hand_over(worker)  # or destroyed, if the pool closed while it was starting
        if worker is None or self._short():  # a start failed, or more are missing: count again now
            self._nudge()

    def _short(self) -> bool:
        """Whether workers are missing beyond those starting (the refill thread starts them)."""
        with self._lock:
            return self.size + len(self._waiters) - len(self._ready) - self._in_flight > 0

    def _retire_due(self) -> bool:
        """Unused for ``retire_idle_s``, and not starting a worker someone waits for (reads without the lock: at
        worst the check comes again next period)."""
        if self.retire_idle_s is None or self._in_flight or self._waiters:
            return False
        return time.monotonic() - self.last_used > self.retire_idle_s

    def _retire(self) -> None:
        """Unused too long: stop refilling and destroy the ready workers (the owner drops a retired pool)."""
        self.retired = True
        self._fail_waiter(SandboxUnavailable(f"the warm pool {self.name} retired", retriable=True), every=True)
        for w in self._drain():
            with contextlib.suppress(Exception):
                w.destroy()
        log.debug("pool %s retired after %.0f s unused", self.name, self.retire_idle_s or 0)

    def close_in_background(self) -> None:
        """``close`` on a thread of its own: for an owner that holds a lock while dropping pools."""
        threading.Thread(target=self.close, name=f"sandforge-pool-close-{self.name}", daemon=True).start()

    def _period(self) -> float:
        """How often the refill thread looks at its ready workers without being nudged."""
        return min(self.idle_s / 4, 1.0)

    def _reap_if_due(self) -> None:
        """Ready workers that died or sat too long are replaced: checked once a period, not on every wake-up
        (a hand-out checks the one it takes; checking them all costs a system call each)."""
        now = time.monotonic()
        if now - self._last_reap >= self._period():
            self._last_reap = now
            self._reap_unusable()

    def _reap_unusable(self) -> None:
        with self._lock:
            stale = [w for w in self._ready if not self._usable(w)]
            for w in stale:
                self._ready.remove(w)
        for w in stale:
            self._discard(w)

    def close(self) -> None:
        self._closed = True
        self._fail_waiter(SandboxUnavailable(f"the warm pool {self.name} was closed"), every=True)
        self._nudge()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for w in self._drain():
            with contextlib.suppress(Exception):
                w.destroy()


def _set_exception(waiter: asyncio.Future[Worker], exc: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(exc)
