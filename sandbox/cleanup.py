"""Tearing sandboxes down off the hot path (one background thread per queue, drained on close and at exit).

Whose leftovers are whose is ``sandbox/ownership.py``."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class CleanupQueue:
    """Runs clean-up jobs (remove a container, reap a runtime process) in order on a daemon thread.

    A caller's execution never waits for its sandbox's removal; ``drain`` finishes the queued jobs before a
    backend closes or the interpreter exits (what is still queued at the deadline runs right there).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                job = self._queue.popleft()
                self._busy += 1
            try:
                _run(job)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def drain(self, timeout: float = 30.0) -> None:
        """Wait for the queued jobs; whatever is still queued after ``timeout`` runs in the caller."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            rest, self._queue = list(self._queue), deque()
        for job in rest:
            _run(job)


def _run(job: Callable[[], None]) -> None:
    try:
        job()
    except Exception:  # a failed clean-up must not kill the queue; the leftover is reaped later
        log.exception("sandbox clean-up failed")
