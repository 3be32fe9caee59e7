"""Keeping a long-running server's memory flat: fewer malloc arenas, and freed memory given back.

Measured in a soak of ``sandforge serve`` (8 clients, mixed exec and agent calls; docs/serve.md, "Memory and
threads"): the Python heap stays flat (tracemalloc: no growing allocation site, object count steady), but
glibc's heap grows: the bytes in use stay at about 28-30 MB while the free bytes its arenas keep resident grow
without end (15 MB -> 24 MB in four minutes), because each of the ~25 threads allocates from one of up to
8 x cores arenas and a chunk freed in one arena is never reused by a thread of another. So:

- :func:`cap_malloc_arenas` limits glibc to ``MALLOC_ARENAS`` arenas (``mallopt(M_ARENA_MAX)``) when the
  server starts, before its thread pools exist (``MALLOC_ARENA_MAX`` in the environment wins, if set);
- :class:`Trimmer` calls ``malloc_trim(0)`` every ``TRIM_INTERVAL_S`` seconds on a thread, which returns the
  free pages of every arena to the system.

Both do nothing on a C library other than glibc (musl, macOS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor
from functools import cache

log = logging.getLogger(__name__)

#: glibc's ``M_ARENA_MAX`` parameter of ``mallopt``.
M_ARENA_MAX = -8
#: The server's malloc arenas (glibc's default is 8 per core): threads share them, contention is rare
#: because the server's threads mostly wait on sandboxes, and freed chunks get reused across threads.
MALLOC_ARENAS = 2
#: How often free heap pages are given back to the system.
TRIM_INTERVAL_S = 30.0


@cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (it has ``mallopt`` and ``malloc_trim``); None otherwise."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: an AttributeError elsewhere)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Limit glibc to ``arenas`` malloc arenas from now on (True if set). Arenas already made stay; call it
    before starting threads. An explicit ``MALLOC_ARENA_MAX`` in the environment is left in charge."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_ARENA_MAX, arenas))


def malloc_trim() -> bool:
    """Give free heap pages back to the system (True if glibc released any)."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


class Trimmer:
    """Calls ``trim`` (default :func:`malloc_trim`) every ``interval_s`` on ``executor`` (a thread: glibc walks
    every arena, a few milliseconds the event loop must not wait for), from :meth:`start` until :meth:`stop`."""

    def __init__(
        self, executor: Executor | None = None, *, interval_s: float = TRIM_INTERVAL_S,
        trim: Callable[[], bool] = malloc_trim,
    ) -> None:  # fmt: skip
        self.executor = executor
        self.interval_s = interval_s
        self.trim = trim
        self.runs = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and _glibc() is not None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sandforge-malloc-trim")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await loop.run_in_executor(self.executor, self.trim)
            except RuntimeError:  # the executor shut down: the server is stopping
                return
            self.runs += 1

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
