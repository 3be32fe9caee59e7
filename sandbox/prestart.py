"""Starting a thread pool's threads up front, so a long-running process's thread count never grows.

``ThreadPoolExecutor`` starts a thread on a submit that finds none idle, up to its bound: under a workload that
slowly reaches new peaks of concurrency, a service's thread count creeps up for minutes. A service that wants
a flat count (``sandforge serve``: its soak goal is no thread growth after the first minute) starts every
thread of each bounded pool when it makes the pool; the bound is the same, only its timing changes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

#: How long the threads being started wait for each other (a pool that cannot start them all gives up).
PRESTART_TIMEOUT_S = 30.0


def prestart(executor: ThreadPoolExecutor, count: int | None = None) -> int:
    """Start ``count`` (default: all ``max_workers``) threads of ``executor`` now; returns how many it has.

    ``count`` tasks are submitted that each wait until all of them run: a submit finds no idle thread (the
    threads already there are held by earlier tasks), so the executor starts one (its own rule), up to its
    bound; then they all return and the threads sit idle. Meant for a pool nothing uses yet: a busy thread
    joins only when its work ends (the wait gives up after ``PRESTART_TIMEOUT_S``)."""
    bound: int = executor._max_workers
    want = bound if count is None else min(bound, count)
    if want <= 0 or len(executor._threads) >= want:
        return len(executor._threads)
    barrier = threading.Barrier(want + 1)
    try:
        futures = [executor.submit(barrier.wait, PRESTART_TIMEOUT_S) for _ in range(want)]
    except RuntimeError:  # shut down already: nothing to start
        barrier.abort()
        return len(executor._threads)
    try:
        barrier.wait(PRESTART_TIMEOUT_S)
    except threading.BrokenBarrierError:  # a thread could not start or join in time: the pool keeps its bound
        barrier.abort()
    for future in futures:
        future.cancel()
    return len(executor._threads)
