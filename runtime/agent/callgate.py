"""How top-level calls into one workspace run side by side (issue 20: a tenant's calls do not serialise).

- Calls of **different roles** run at once; calls of the **same role** take turns (one lock per role), so
  a role's committed context is never read by two attempts that would both write it.
- A nested call (``tool("other")`` inside a program) reads and writes another role's context without that
  role's lock (taking it could deadlock two calls that call each other's roles). Its writes are checked
  instead: the top-level attempt commits only if every context it writes is still the version it read
  (``state.CommitConflict`` otherwise), and a call whose commit conflicted runs again, alone
  (:meth:`CallGate.exclusive`: no other call runs meanwhile), so nothing is lost and nothing half-done is kept.

:class:`CallGate` is the shared/exclusive gate every top-level call passes; re-entrant per thread (a call
made from inside a call on the same thread passes through).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CallGate:
    """Shared for ordinary calls, exclusive for a call that runs again after a commit conflict."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive runs waiting: new shared entries wait behind them (no starvation)
        self._local = threading.local()
        self._role_locks: dict[str, threading.RLock] = {}
        self._roles_lock = threading.Lock()

    @property
    def _depth(self) -> int:
        depth: int = getattr(self._local, "depth", 0)
        return depth

    @property
    def nested(self) -> bool:
        """This thread's current call was made from inside another call of the same workspace."""
        return self._depth > 1

    def role_lock(self, role: str) -> threading.RLock:
        with self._roles_lock:
            lock = self._role_locks.get(role)
            if lock is None:
                lock = self._role_locks[role] = threading.RLock()
            return lock

    @contextmanager
    def shared(self, role: str) -> Iterator[None]:
        """Enter as an ordinary call of ``role``: beside calls of other roles, after those of ``role``."""
        depth = self._depth
        if depth == 0:
            with self._cond:
                while self._exclusive or self._waiting:
                    self._cond.wait()
                self._shared += 1
        self._local.depth = depth + 1
        try:
            with self.role_lock(role):
                yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._shared -= 1
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Enter alone: once every call in progress has left, and none enters until this one has."""
        depth = self._depth
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
