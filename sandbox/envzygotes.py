"""Environment zygotes (issue 39 item 3): for a program that declares packages, the subprocess backend forks its
warm workers from a zygote that already imported the environment's top-level modules, so a warm run pays a
fork for ``import pandas``, not the import itself.

One zygote per (limits, environment, modules asked for), built on first use (the import runs once, in the new
zygote: ``sandbox/inside/preload.py``), kept while used: at most ``SandboxConfig.env_zygotes_max`` (LRU; each
holds its packages' memory), and one nothing forked from for ``env_pool_idle_s`` is closed, like its warm pool.
An evicted zygote forks nothing more at once, and is closed when a run it may have started is over (its time
limit): closing it under a run would end that run.
A build that fails (an import error, a package that starts a thread at import) is remembered for
``RETRY_AFTER_S`` and the plain zygote serves meanwhile: the program then imports the package itself, as before.
The zygote is confined before it imports (``sandbox/inside/confine.py``: its own namespaces, a private
read-only root, the sandbox user, no capability, rlimits, a seccomp filter), which the host verifies from
outside before it forks anything (``ConfinedZygote``); where it cannot be (no root, no libseccomp:
``confinable``) there is none, and ``doctor`` says why. A zygote forks runners for its own
environment only (the inside refuses another, and the runner reports another's modules as ``missing``, which
``require_mounted`` refuses).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import platform
import shutil
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandforge.sandbox import leftovers, seccomp, verify
from sandforge.sandbox.environment import MountedEnvironment
from sandforge.sandbox.protocol import Limits
from sandforge.sandbox.zygote import Zygote, ZygoteError

log = logging.getLogger(__name__)

#: How long a failed build is not retried (the plain zygote serves meanwhile).
RETRY_AFTER_S = 60.0
#: An evicted zygote is closed this long after the time limit of a run it may have started.
RETIRE_GRACE_S = 5.0

EnvZygoteKey = tuple[Limits, str, str, tuple[str, ...]]


@dataclass
class _Entry:
    zygote: Zygote
    last_used: float


class EnvZygotes:
    """The LRU of environment zygotes of one backend. ``build(limits, environment)`` starts one (it may take
    seconds: the import), on the thread that first needs it; other environments' spawns do not wait for it."""

    def __init__(self, build: Callable[[Limits, MountedEnvironment], Zygote], *, bound: int, idle_s: float) -> None:
        self._build = build
        self.bound = bound
        self.idle_s = idle_s
        self._entries: OrderedDict[EnvZygoteKey, _Entry] = OrderedDict()
        self._failed: dict[EnvZygoteKey, float] = {}
        self._building: dict[EnvZygoteKey, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: evicted zygotes, closed once the runs they may have started are over (``_retire``)
        self._retiring: dict[int, tuple[Zygote, threading.Timer]] = {}
        self.stats = {"built": 0, "evicted": 0, "failed": 0}

    def get(self, limits: Limits, environment: MountedEnvironment) -> Zygote | None:
        """The live zygote of ``environment`` (built now if there is none), or None: none may be kept
        (``bound`` 0) or its build failed lately (the caller uses the plain zygote)."""
        if self.bound <= 0 or self._closed:
            return None
        key: EnvZygoteKey = (limits, environment.env_id, environment.site, environment.modules)
        now = time.monotonic()
        with self._lock:
            stale = self._expire(now)
            found = self._live(key, now)
            building = self._building.setdefault(key, threading.Lock())
        _close(stale)
        if found is not None:
            return found
        with building:  # one build per key; the others wait for it, then take it
            with self._lock:
                found = self._live(key, now)
                if found is not None or now - self._failed.get(key, -RETRY_AFTER_S) < RETRY_AFTER_S:
                    return found
            try:
                zygote = self._build(limits, environment)
            except ZygoteError as exc:
                log.warning("environment %s: no pre-imported zygote, importing per run: %s", environment.env_id, exc)
                with self._lock:
                    self._failed[key] = time.monotonic()
                    self.stats["failed"] += 1
                return None
            kept: Zygote | None = zygote
            with self._lock:
                evicted: list[Zygote] = []
                if self._closed:  # the backend closed while this one was importing: it serves nobody
                    evicted, kept = [zygote], None
                else:
                    self._entries[key] = _Entry(zygote, time.monotonic())
                    self.stats["built"] += 1
                while len(self._entries) > self.bound:
                    (old_limits, *_), entry = self._entries.popitem(last=False)
                    self._retire(entry.zygote, old_limits)
                    self.stats["evicted"] += 1
            _close(evicted)
            return kept

    def _retire(self, zygote: Zygote, limits: Limits) -> None:
        """Under the lock: an evicted zygote forks nothing more (it is out of the registry) and is closed once
        a run it started may still be going is over (its time limit, plus a grace), not under that run."""
        timer = threading.Timer(limits.timeout_s + RETIRE_GRACE_S, self._close_retired, (id(zygote),))
        timer.daemon = True
        self._retiring[id(zygote)] = (zygote, timer)
        timer.start()

    def _close_retired(self, key: int) -> None:
        with self._lock:
            found = self._retiring.pop(key, None)
        if found is not None:
            found[0].close()

    def _live(self, key: EnvZygoteKey, now: float) -> Zygote | None:
        """Under the lock: the key's zygote if it is alive (marked used), else None (a dead one dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not entry.zygote.alive():
            del self._entries[key]
            return None
        entry.last_used = now
        self._entries.move_to_end(key)
        return entry.zygote

    def _expire(self, now: float) -> list[Zygote]:
        """Under the lock: take the zygotes nothing forked from for ``idle_s``."""
        idle = [key for key, entry in self._entries.items() if now - entry.last_used > self.idle_s]
        return [self._entries.pop(key).zygote for key in idle]

    def describe(self) -> list[dict[str, object]]:
        """The live zygotes, most recently used last: environment, modules, pid (``doctor``, tests)."""
        with self._lock:
            return [{"env_id": env_id, "modules": list(modules), "pid": entry.zygote.proc.pid}
                    for (_, env_id, _, modules), entry in self._entries.items()]  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zygotes = [entry.zygote for entry in self._entries.values()]
            self._entries.clear()
            retiring, self._retiring = list(self._retiring.values()), {}
        for zygote, timer in retiring:
            timer.cancel()
            zygotes.append(zygote)
        _close(zygotes)


def confinable(rootless: bool) -> str | None:
    """Why an environment zygote cannot be confined here (None: it can). Its runners write their own id maps
    through a ``/proc`` that shows them only themselves, which only real root can mount."""
    from sandforge.sandbox.inside.confine import SYSCALLS  # the runner's lock-down (ctypes): once a backend starts

    if rootless:
        return "rootless: only real root can give a confined zygote its own /proc (its runners' id maps)"
    if platform.machine() not in SYSCALLS:
        return f"{platform.machine()}: the confined zygote's system calls are known on {', '.join(SYSCALLS)} only"
    if seccomp.zygote_filter() is None:
        return "no libseccomp to compile the zygote's filter"
    return None


class ConfinedZygote(Zygote):
    """A zygote that confines itself before it imports an environment's modules, verified from outside once it
    says ready (a claim is not a wall): its own mount, network, IPC and UTS namespaces, a root that is not the
    host's, not root, no capability in any set, ``no_new_privs``, a seccomp filter, rlimits. Its root's mount
    point (a directory of the host's, empty) goes with it."""

    def __init__(self, python: str, runner: Path, boot: dict[str, Any], **kwargs: Any) -> None:
        self.root = leftovers.new_workdir()
        filter_bpf = seccomp.zygote_filter()
        boot = {**boot, "confine": {"root": str(self.root),
                                    "seccomp_bpf_b64": base64.b64encode(filter_bpf or b"").decode()}}  # fmt: skip
        try:
            super().__init__(python, runner, boot, **kwargs)
        except ZygoteError:
            self._remove_root()
            raise
        missing = unconfined(self.proc.pid)
        if missing:
            self.close()
            raise ZygoteError(f"the environment zygote is not confined: {', '.join(missing)}")

    def close(self) -> None:
        """End what the zygote forks first (its runners, and what an import left, which it reaps as their
        subreaper: the zygote itself may not signal), then the zygote."""
        if self.proc.poll() is None:
            for pid in _children(self.proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        super().close()
        self._remove_root()

    def _remove_root(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.root)  # noqa: PTH106 - empty: the zygote's tmpfs was in its own namespace
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def unconfined(pid: int) -> list[str]:
    """The walls of a confined zygote that the host cannot see from outside, by name (empty: all up)."""
    status = verify.proc_status(pid)
    checks = {f"{kind}_namespace": separate
              for kind, separate in verify.separate_namespaces(pid, ("mnt", "net", "ipc", "uts")).items()}  # fmt: skip
    checks["private_root"] = verify.other_root(pid)
    checks["unprivileged_user"] = verify.non_root(verify.uids(status)) and verify.no_capabilities(
        status, ("Inh", "Prm", "Eff", "Amb", "Bnd")
    )
    checks["rlimits"] = verify.rlimits_set(pid)
    checks["no_new_privs"] = verify.no_new_privs(status)
    checks["seccomp"] = verify.seccomp_filtered(status)
    return [name for name, up in checks.items() if not up]


def _close(zygotes: list[Zygote]) -> None:
    for zygote in zygotes:
        zygote.close()
