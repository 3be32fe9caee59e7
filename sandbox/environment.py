"""A ready environment, as the sandbox takes it: checked before anything is mounted.

``runtime/environments`` builds an environment on the host (``envs/ID/site`` plus ``envs/ID/environment.json``,
the record written last, its ready marker); a request names it in an ``EnvironmentMount``. The sandbox layer
never imports ``runtime/`` (import contracts), so it checks the request against the environment's own files:
the site is a real directory (no symlink anywhere on its path, nothing planted in the state directory) named
``site`` inside a directory named after the id, beside a record of that id; the modules asked for are among
those the record says the environment provides; the site is writable by its owner only, owned by this user,
and holds no uv cache. Anything else is refused in one line (``EnvironmentRefused``, an ``invalid_request``)
and nothing is mounted. The checks are remembered per (site, record inode and mtime), so a warm execution
pays a few ``stat`` calls for them, not a JSON parse.
"""
# ruff: noqa: PTH117, PTH118, PTH119, PTH120
# (string paths and os.lstat on the hot path of every execution with an environment)

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.inside.world import ALLOWED_MODULES
from sandforge.sandbox.protocol import ENV_MOUNT_PATH, BootEnvironment, EnvironmentMount, ReadyFrame

__all__ = [
    "ENV_MOUNT_PATH", "EnvironmentRefused", "Interpreter", "MountedEnvironment", "check_mount", "require_mounted",
]  # fmt: skip

RECORD_NAME = "environment.json"
SITE_NAME = "site"
MAX_RECORD_BYTES = 1024 * 1024
#: Files whose presence in a site means a uv cache (or part of one) would enter the sandbox.
_CACHE_MARKERS = ("CACHEDIR.TAG", ".lock", "sdists-v9", "wheels-v5", "archive-v0")
#: Top-level names a program already imports as the runner's own proxies: an environment may not shadow them.
_RESERVED = frozenset(name.split(".")[0] for name in ALLOWED_MODULES) | {"requests", "urllib", "sandforge"}


class EnvironmentRefused(ValueError):
    """The request's environment is not one the sandbox may mount; the message is one line."""


@dataclass(frozen=True)
class MountedEnvironment:
    """A checked environment: what a backend mounts and what its runner exposes."""

    env_id: str
    site: str
    modules: tuple[str, ...]

    def boot(self, *, bind: bool) -> BootEnvironment:
        """The boot frame's part: a subprocess runner binds ``site`` itself (``bind``), a container's
        runtime mounts it."""
        return BootEnvironment(env_id=self.env_id, modules=list(self.modules), bind_source=self.site if bind else None)


@dataclass(frozen=True)
class Interpreter:
    """The interpreter that runs programs on a backend, which an environment must be built for
    (``runtime/environments``: ``probe(python)`` for ``python``; ``probe_container(api, image,
    runtime=runtime)`` for an ``image``, which runc/runsc unpack too)."""

    backend: str
    python: str | None = None
    image: str | None = None
    runtime: str | None = None


_CHECKED: dict[tuple[str, int, int, int], frozenset[str]] = {}
_CHECKED_LOCK = threading.Lock()


def check_mount(mount: EnvironmentMount) -> MountedEnvironment:
    """The environment ``mount`` names, checked; ``EnvironmentRefused`` says why it cannot be mounted."""
    site = mount.site
    if not os.path.isabs(site) or os.path.realpath(site) != os.path.normpath(site) or site != os.path.normpath(site):
        raise EnvironmentRefused(f"environment {mount.env_id}: {site!r} is not an absolute path free of symlinks")
    parent = os.path.dirname(site)
    if os.path.basename(site) != SITE_NAME or os.path.basename(parent) != mount.env_id:
        raise EnvironmentRefused(f"environment {mount.env_id}: {site!r} is not the site directory of that environment")
    site_info = _lstat(site, mount.env_id)
    record_path = os.path.join(parent, RECORD_NAME)
    record_info = _lstat(record_path, mount.env_id, what="ready marker")
    if not stat.S_ISDIR(site_info.st_mode) or not stat.S_ISREG(record_info.st_mode):
        raise EnvironmentRefused(f"environment {mount.env_id} is not ready (no site directory or no record)")
    for path, info in ((site, site_info), (parent, _lstat(parent, mount.env_id)), (record_path, record_info)):
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise EnvironmentRefused(f"environment {mount.env_id}: {path} is writable by another user")
    key = (site, record_info.st_ino, record_info.st_mtime_ns, site_info.st_mtime_ns)
    with _CHECKED_LOCK:
        provided = _CHECKED.get(key)
    if provided is None:
        provided = _provided(record_path, mount.env_id)
        if any(os.path.lexists(os.path.join(site, marker)) for marker in _CACHE_MARKERS):
            raise EnvironmentRefused(f"environment {mount.env_id}: its site holds a uv cache (never mounted)")
        with _CHECKED_LOCK:
            _CHECKED[key] = provided
    unknown = [name for name in mount.modules if name not in provided]
    if unknown:
        raise EnvironmentRefused(f"environment {mount.env_id} does not provide {', '.join(unknown)}")
    reserved = [name for name in mount.modules if name in _RESERVED]
    if reserved:
        names = ", ".join(reserved)
        raise EnvironmentRefused(f"environment {mount.env_id}: {names} would shadow the sandbox's own modules")
    return MountedEnvironment(env_id=mount.env_id, site=site, modules=mount.modules)


def _lstat(path: str, env_id: str, *, what: str = "directory") -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise EnvironmentRefused(f"environment {env_id} is not ready ({what} {path}: {exc.strerror})") from None


def _provided(record_path: str, env_id: str) -> frozenset[str]:
    """The top-level modules the environment's record lists, after checking it is that environment's."""
    try:
        with open(record_path, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
        record: Any = json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("env_id") != env_id or not isinstance(record.get("provides"), dict):
        raise EnvironmentRefused(f"environment {env_id}: its record is missing, unreadable or another environment's")
    names: set[str] = set()
    for modules in record["provides"].values():
        if isinstance(modules, list):
            names.update(m for m in modules if isinstance(m, str))
    return frozenset(names)


def require_mounted(
    backend: str, environment: MountedEnvironment | None, ready: ReadyFrame, mounts: dict[str, tuple[str, str]] | None
) -> None:
    """Refuse a worker whose environment is not mounted read-only: as its runner reports it (``ready``) and,
    where the host can read the worker's mount table (``mounts``: subprocess, runc), as the kernel shows it."""
    if environment is None:
        if ready.environment is not None:
            raise SandboxUnavailable(f"the {backend} sandbox reports an environment nobody asked for", retriable=False)
        return
    if ready.environment != "read_only":
        seen = ready.environment or "not reported"
        where = f"environment {environment.env_id} read-only at {ENV_MOUNT_PATH}"
        raise SandboxUnavailable(f"the {backend} sandbox does not show {where} ({seen})", retriable=False)
    if mounts is not None:
        entry = mounts.get(ENV_MOUNT_PATH)
        if entry is None or "ro" not in entry[1].split(","):
            raise SandboxUnavailable(
                f"the {backend} sandbox's mount table has no read-only {ENV_MOUNT_PATH} ({entry})", retriable=False
            )
