"""How the async execution API (``sandforge.sandbox.AsyncSandbox``) runs the sync API's own code on a loop.

    async with AsyncSandbox(SandboxConfig(backend="subprocess")) as sb:
        outcome = await sb.execute(ExecutionRequest(code="return 1"))

An execution is steps (``sandbox/steps.py``) shared with :meth:`Sandbox.execute`; here they are driven on the
event loop. Where a worker's channel is file descriptors (subprocess, runc, runsc), waiting for its output is
``loop.add_reader`` on them: no thread waits per execution. What may block runs on a small thread pool: a nested
call's answer (``tool(...)``, ``fetch()``), reaping an exit, starting a worker outside the warm pool, and a
Docker or gVisor-through-Docker execution as a whole (the Docker client blocks). Workers come from the same
warm pools (``WarmPool.acquire_async``: waiting for one holds no thread either).

Cancelling the awaiting task ends the execution as its time limit would: the worker is killed and cleaned up,
and the task gets ``CancelledError``, never an outcome (nothing of it can be committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import selectors
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from queue import SimpleQueue
from typing import Any, TypeVar

from sandforge.sandbox.steps import Await, Blocking, Cancelled, Chunks, Detach, Effect, Poll, Steps

T = TypeVar("T")

#: Threads for short blocking work (reaping an exit, starting a worker): a fraction of the executions in flight.
DEFAULT_THREADS = 8
#: Threads for long blocking work: nested calls' answers, fetches, whole Docker executions (one each while it runs).
DEFAULT_LONG_THREADS = 64


class Threads:
    """The async API's two thread pools: ``short`` work never waits behind ``long`` work (a nested call that
    runs for seconds must not hold up the reaping its own nested executions need), and one clean-up thread.

    Detached clean-ups (``Detach``: destroying a worker after its execution) are the one hand-off every
    execution makes. They go, gathered per loop iteration, through a ``SimpleQueue`` to a long-lived clean-up
    thread: no ``Future``, no ``Condition``, no semaphore per clean-up (``Executor.submit`` and its completion
    cost the event loop's thread more than the clean-up's own work). While that thread is busy with an earlier
    batch, a batch goes to the short pool instead, so clean-ups still run side by side under load."""

    def __init__(self, short: int = DEFAULT_THREADS, long: int = DEFAULT_LONG_THREADS) -> None:
        self.short = ThreadPoolExecutor(max_workers=max(1, short), thread_name_prefix="sandforge-aio")
        self.long = ThreadPoolExecutor(max_workers=max(1, long), thread_name_prefix="sandforge-aio-long")
        #: batches handed to the short pool (the clean-up thread was busy): a shutdown waits for them
        self._detached: set[Future[None]] = set()
        #: clean-ups detached in this loop iteration, handed over together at the next one (``detach(loop=...)``)
        self._batch: list[Callable[[], None]] = []
        #: what runs first with the next batch (a warm pool's refill, owed since a worker was taken: ``after_run``)
        self._after: dict[Callable[[], None], None] = {}
        #: a hand-over is scheduled on a loop
        self._scheduled = False
        self._cleaner: _Cleaner | None = None
        # Re-entrant: stopping the pools under it cancels queued futures, whose callbacks run on this thread.
        self._lock = threading.RLock()
        self._stopped = False

    def for_effect(self, effect: Blocking) -> ThreadPoolExecutor:
        return self.long if effect.interruptible or effect.on_cancel is not None else self.short

    def detach(self, fn: Callable[[], None], *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``fn`` off this thread, not waited for here; :meth:`shutdown` (or :meth:`shutdown_async`) waits for
        it. With ``loop`` (the running one) it is handed over at that loop's next iteration, with every other
        clean-up of this iteration, after what the current step still does with the outcome (``POST /v1/exec``
        answers and flushes its response first, so the clean-up's thread does not compete with it); a shutdown
        that comes first runs it itself, exactly once."""
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._batch.append(fn)
        if stopped:  # shut down already (a close raced this execution): clean up here and now
            _quietly(fn)
            return
        self.hand_over_soon(loop)

    def after_run(self, fn: Callable[[], None]) -> None:
        """``fn`` (cheap, idempotent: a warm pool's refill wake-up) on the clean-up thread, first in the next
        hand-over: after the execution running now has answered (``drive`` schedules it when it ends), so the
        replacement worker's start does not compete with this execution for the loop's thread."""
        with self._lock:
            if not self._stopped:
                self._after[fn] = None
                return
        fn()

    def hand_over_soon(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Hand what is gathered over at ``loop``'s next iteration (now without a loop), once."""
        with self._lock:
            if self._scheduled or not (self._batch or self._after):
                return
            self._scheduled = loop is not None
        if loop is not None:
            try:
                loop.call_soon(self._hand_over)
                return
            except RuntimeError:  # a closed loop: hand it over now
                pass
        self._hand_over()

    def _take(self) -> list[Callable[[], None]]:
        """Under the lock: what is gathered, the owed ``after_run`` calls first."""
        batch = [*self._after, *self._batch]
        self._after, self._batch, self._scheduled = {}, [], False
        return batch

    def _hand_over(self) -> None:
        """The batch gathered so far to the clean-up thread (or, while it is busy, to the short pool); run here
        when a shutdown came first and took nothing (it takes the batch under the same lock)."""
        with self._lock:
            batch = self._take()
            if not batch:
                return
            if self._stopped:
                work = None
            else:
                if self._cleaner is None:
                    self._cleaner = _Cleaner()
                if self._cleaner.put(batch):
                    return
                work = self.short.submit(_run_all, batch)
                self._detached.add(work)
        if work is None:
            _run_all(batch)
            return
        work.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._detached.discard(future)

    def _pending_or_stop(self) -> list[Future[None]]:
        """The detached clean-ups still to wait for; when there are none, the pools are stopped (under the
        lock: no clean-up can be handed over between the last wait and the stop, to be cancelled unrun) and the
        clean-up thread told to end after what it holds. Clean-ups gathered for a loop iteration that has not
        come yet are run here (that loop may never run again)."""
        while True:
            with self._lock:
                batch = self._take()
                if not batch:
                    pending = [f for f in self._detached if not f.done()]
                    if pending:
                        return pending
                    if not self._stopped:
                        self._stopped = True
                        for pool in (self.short, self.long):
                            pool.shutdown(wait=False, cancel_futures=True)
                        if self._cleaner is not None:
                            self._cleaner.stop()
                    cleaner = self._cleaner
                    return [] if cleaner is None or cleaner.ended.done() else [cleaner.ended]
            _run_all(batch)

    def shutdown(self) -> None:
        """Stop both pools and the clean-up thread; detached clean-up already handed over runs to its end first
        (a worker's work directory and descriptors never outlive the close). Blocks: for sync owners."""
        while pending := self._pending_or_stop():
            futures.wait(pending)

    async def shutdown_async(self) -> None:
        """:meth:`shutdown` for an event loop: the detached clean-ups are awaited (their futures wake the loop),
        so the loop keeps serving while a slow one ends. A cancelled wait leaves them running and queued."""
        await asyncio.sleep(0)  # clean-ups handed over in this loop's last step are handed over first
        while pending := self._pending_or_stop():
            await asyncio.wait([asyncio.wrap_future(f) for f in pending])


class _Cleaner:
    """One long-lived thread running batches of clean-ups from a ``SimpleQueue``, in order (see
    :class:`Threads`). ``put`` refuses a batch while the thread is busy with another; after ``stop`` it runs
    what it holds, then ends (``ended``)."""

    def __init__(self) -> None:
        self._queue: SimpleQueue[list[Callable[[], None]] | None] = SimpleQueue()
        self._busy = False
        self.ended: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name="sandforge-aio-cleanup", daemon=True)
        self._thread.start()

    def put(self, batch: list[Callable[[], None]]) -> bool:
        if self._busy or self.ended.done():  # a flag read: at worst one batch waits behind another
            return False
        self._busy = True  # until the thread has run it (set here: a second put in a row goes to the pool)
        self._queue.put(batch)
        return True

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        try:
            while (batch := self._queue.get()) is not None:
                _run_all(batch)
                self._busy = False
        finally:
            self.ended.set_result(None)


async def unless_cancelled(started: asyncio.Future[Any], executor: Executor | None = None) -> Any:
    """A worker being started on a thread. If the caller is cancelled meanwhile, the start is waited for and
    the worker destroyed (on ``executor``) before ``CancelledError`` is raised: nothing is left running."""
    try:
        return await asyncio.shield(started)
    except asyncio.CancelledError:
        while not started.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([started])
        if not started.cancelled() and started.exception() is None:
            destroy = started.result().destroy
            try:
                await asyncio.get_running_loop().run_in_executor(executor, functools.partial(_quietly, destroy))
            except RuntimeError:  # its pool was shut down meanwhile (a close raced this start)
                _quietly(destroy)
        raise


async def drive(steps: Steps[T], threads: Threads) -> T:
    """Drive ``steps`` on the running loop (see ``sandbox/steps.py``). A cancellation is thrown into them as
    :class:`Cancelled` where they wait (after a non-interruptible call returns: ``Blocking.on_cancel`` makes it
    return soon); they end the exchange and clean up, and ``CancelledError`` is raised here afterwards."""
    loop = asyncio.get_running_loop()
    watch = _Watch(loop)
    try:
        return await _drive(steps, threads, loop, watch)
    finally:
        watch.clear()
        threads.hand_over_soon(loop)  # what ``after_run`` owes, with or without a clean-up (one raised)


async def _drive(steps: Steps[T], threads: Threads, loop: asyncio.AbstractEventLoop, watch: _Watch) -> T:
    answer: Any = None
    error: BaseException | None = None
    cancelled = False
    while True:
        try:
            effect = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            if cancelled:
                raise asyncio.CancelledError from None
            result: T = done.value
            return result
        except Cancelled:
            raise asyncio.CancelledError from None
        answer, error = None, None
        if not isinstance(effect, Poll):
            watch.clear()  # before anything else runs: a clean-up may close (and the system reuse) the descriptors
        try:
            answer, late = await _wait(loop, effect, threads, watch)
            if late and not cancelled:
                cancelled, error = True, Cancelled()
        except asyncio.CancelledError:
            watch.clear()
            if cancelled:  # a second cancellation while cleaning up: stop where we are
                steps.close()
                raise
            cancelled, error = True, Cancelled()
        except BaseException as exc:  # raised in the steps, at their yield (as the sync driver does)
            watch.clear()
            error = exc


async def _wait(loop: asyncio.AbstractEventLoop, effect: Effect, threads: Threads, watch: _Watch) -> tuple[Any, bool]:
    """Where the steps wait: the answer, and whether a cancellation came while a call could not be left."""
    if isinstance(effect, Poll):
        return await _poll(loop, effect, threads.long, watch), False
    if isinstance(effect, Await):
        return await effect.start(), False
    if isinstance(effect, Detach):
        threads.detach(effect.fn, loop=loop)
        return None, False
    if effect.on_loop is not None:
        return await effect.on_loop(), False
    return await _blocking(loop, effect, threads.for_effect(effect))


class _Watch:
    """The descriptors one execution waits on, watched by the loop from its first :class:`Poll` until the steps
    ask for something else (then :meth:`clear`), not registered and removed again around every poll.

    A descriptor that becomes readable while nobody waits (the steps are handling frames, or a nested call
    runs) stops being watched until the next poll: level-triggered, it would otherwise wake the loop on
    every iteration. The driver clears the watch before anything that may close the descriptors (a clean-up,
    a cancellation thrown into the steps), so a number the system reuses is never left registered."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fds: set[int] = set()
        self.waiter: asyncio.Future[None] | None = None

    def _ready(self, fd: int) -> None:
        waiter = self.waiter
        if waiter is None:  # nobody polls now: stop watching it until the next poll
            self.loop.remove_reader(fd)
            self.fds.discard(fd)
        elif not waiter.done():
            waiter.set_result(None)

    def _timeout(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, fds: set[int], timeout: float) -> None:
        """Until one of ``fds`` is readable or ``timeout`` passed; only ``fds`` stay watched."""
        for fd in self.fds - fds:  # ended (EOF) since the last poll
            self.loop.remove_reader(fd)
        for fd in fds - self.fds:
            self.loop.add_reader(fd, self._ready, fd)
        self.fds = set(fds)
        self.waiter = waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._timeout)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def clear(self) -> None:
        for fd in self.fds:
            self.loop.remove_reader(fd)
        self.fds = set()


async def _poll(loop: asyncio.AbstractEventLoop, effect: Poll, executor: ThreadPoolExecutor, watch: _Watch) -> Chunks:
    """``io.poll(timeout)`` without a thread: wait for any of its descriptors to be readable on the loop."""
    io = effect.io
    selector = getattr(io, "selector", None)
    if not isinstance(selector, selectors.BaseSelector):  # a channel without descriptors of its own
        polled: Chunks = await loop.run_in_executor(executor, io.poll, effect.timeout)
        return polled
    chunks = io.poll(0)
    if chunks:
        return chunks
    fds = {key.fd for key in selector.get_map().values()}
    if not fds:
        watch.clear()
        await asyncio.sleep(0)
        return []
    deadline = loop.time() + effect.timeout
    try:
        while True:
            await watch.wait(fds, deadline - loop.time())
            chunks = io.poll(0)
            # a wake-up with nothing to read (a loop that queues readiness callbacks may run one queued before
            # the last read): wait on, up to the same deadline
            if chunks or loop.time() >= deadline:
                return chunks
    except BaseException:
        watch.clear()
        raise


async def _blocking(
    loop: asyncio.AbstractEventLoop, effect: Blocking, executor: ThreadPoolExecutor
) -> tuple[Any, bool]:
    """``effect.fn()`` on the thread pool: its value, and whether the caller was cancelled meanwhile (for a
    call that is not interruptible, which is waited for to the end, after ``on_cancel``)."""
    # In the caller's context (a call's cancellation scope reaches the nested calls it makes: runtime/agent/aio.py)
    context = contextvars.copy_context()
    if effect.interruptible:
        try:
            return await loop.run_in_executor(executor, context.run, effect.fn), False
        except asyncio.CancelledError:
            if effect.on_cancel is not None:
                _quietly(effect.on_cancel)  # tells whoever runs it to stop (a cluster node): nobody waits for it
            raise
    running = loop.run_in_executor(executor, context.run, effect.fn)
    late = False
    while True:
        try:
            return await asyncio.shield(running), late
        except asyncio.CancelledError:
            if running.cancelled():
                raise
            if not late and effect.on_cancel is not None:
                _quietly(effect.on_cancel)
            late = True


def _run_all(batch: list[Callable[[], None]]) -> None:
    for fn in batch:
        _quietly(fn)


def _quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # ending a worker early is best effort: the call it ends still cleans up after itself
        return


__all__ = ["DEFAULT_LONG_THREADS", "DEFAULT_THREADS", "Threads", "drive", "unless_cancelled"]
