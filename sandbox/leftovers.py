"""What sandforge processes that died left behind, found and removed by one reaper for every backend.

A host killed with SIGKILL cleans nothing up. Everything it creates is therefore named after it (a
``process_tag``: pid and start time, so a reused pid does not count as alive): subprocess work directories
``<tmp>/sandforge-work-<tag>-*``, hand-off directories (``sandbox/handoff.py``), Docker containers (label
``sandforge.owner``), OCI containers and bundles (``sf-<tag>-<n>``). Whatever belongs to a process that is
gone is removed when any backend starts (once per process, in the background; a subprocess backend looks at
the container engines a few seconds after its start) and by
``sandforge cleanup --apply``. Only this user's files are touched, and only directories named as above.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sandforge.sandbox import oci_runtime
from sandforge.sandbox.containers import ID_PREFIX, LABEL, OWNER_LABEL
from sandforge.sandbox.ownership import host_owner_alive, named_owner_alive, process_tag, tag_alive

log = logging.getLogger(__name__)

#: Subprocess work directories: ``<tmp>/<WORKDIR_PREFIX><tag>-<random>``.
WORKDIR_PREFIX = "sandforge-work-"

Kind = Literal["workdir", "handoff", "container", "oci_container", "bundle"]


@dataclass
class Leftover:
    """One thing a dead process left: what it is, its name, whose it was, and what became of it."""

    kind: Kind
    name: str
    owner: str
    where: str
    removed: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_workdir() -> Path:
    """A fresh private work directory for one subprocess sandbox, named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{process_tag()}-"))


def _tag_of(name: str, prefix: str) -> str:
    """``<pid>-<start>`` from ``<prefix><pid>-<start>-<rest>``."""
    pid, _, rest = name[len(prefix) :].partition("-")
    return f"{pid}-{rest.partition('-')[0]}"


def _dead_dirs(base: Path, prefix: str, kind: Kind, uids: set[int]) -> list[Leftover]:
    found: list[Leftover] = []
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            if not entry.name.startswith(prefix):
                continue
            tag = _tag_of(entry.name, prefix)
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if stat.S_ISDIR(info.st_mode) and info.st_uid in uids and not tag_alive(tag):
                    found.append(Leftover(kind, entry.name, tag, str(base)))
    return found


def _own_uids() -> set[int]:
    """Whose directories count as ours: this user's, and (as root) the sandbox user's, which owns work dirs."""
    uids = {os.getuid()}
    if os.geteuid() == 0:
        from sandforge.sandbox.config import SandboxConfig

        config = SandboxConfig()
        uids.add(config.sandbox_uid)
    return uids


def _files() -> list[Leftover]:
    from sandforge.sandbox import handoff

    uids = _own_uids()
    found = _dead_dirs(Path(tempfile.gettempdir()), WORKDIR_PREFIX, "workdir", uids)
    found += _dead_dirs(handoff.base_dir(), handoff.PREFIX, "handoff", {os.getuid()})
    return found


def _docker(config: Any) -> tuple[Any, list[Leftover]]:
    """Containers labelled by a dead owner, and the API client to remove them (None without an engine)."""
    from sandforge.sandbox import docker_engine

    socket_path = Path("/var/run/docker.sock")
    if not (config.docker_base_url or os.environ.get("DOCKER_HOST") or socket_path.exists()):
        return None, []
    try:
        api = docker_engine.connect(config.docker_base_url, timeout=10.0)
        listed = api.containers(all=True, filters={"label": f"{LABEL}=1"})
    except Exception as exc:  # no engine: nothing of ours can be running in it either
        log.debug("docker leftovers not checked: %s", exc)
        return None, []
    found: list[Leftover] = []
    for info in listed:
        owner = (info.get("Labels") or {}).get(OWNER_LABEL, "")
        if not owner or not host_owner_alive(owner):
            found.append(Leftover("container", str(info["Id"])[:12], owner or "unknown", "docker"))
    return api, found


def _oci() -> list[Leftover]:
    """Containers the runc/runsc runtimes still list, and bundle directories, of dead owners (root only)."""

    found: list[Leftover] = []
    if os.geteuid() != 0:
        return found
    listed: set[str] = set()
    for runtime in ("runc", "runsc"):
        command = oci_runtime.runtime_command(runtime)
        if command is None:
            continue
        try:
            names = subprocess.run(
                [*command, "list", "--quiet"], capture_output=True, text=True, timeout=30, check=False,
                env=oci_runtime.RUNTIME_ENV,
            ).stdout.split()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            continue
        for name in names:
            if name.startswith(f"{ID_PREFIX}-") and not named_owner_alive(name, ID_PREFIX):
                listed.add(name)
                found.append(Leftover("oci_container", name, _tag_of(name, f"{ID_PREFIX}-"), runtime))
    bundles = oci_runtime.STATE_DIR / "bundles"
    with contextlib.suppress(OSError):
        for entry in bundles.iterdir():
            name = entry.name
            if name.startswith(f"{ID_PREFIX}-") and not named_owner_alive(name, ID_PREFIX):
                found.append(Leftover("bundle", entry.name, _tag_of(entry.name, f"{ID_PREFIX}-"),
                                      str(bundles)))  # fmt: skip
    return found


def find(*, containers: bool = True) -> tuple[list[Leftover], Any]:
    """Every leftover of a dead owner (and the Docker client that can remove its containers, if any)."""
    from sandforge.sandbox.config import SandboxConfig

    found = _files()
    api = None
    if containers:
        api, docker_found = _docker(SandboxConfig.from_env())
        found += docker_found + _oci()
    return found, api


def _remove(item: Leftover, api: Any) -> None:
    if item.kind in ("workdir", "handoff", "bundle"):
        path = Path(item.where) / item.name
        if item.kind == "bundle":

            for runtime in ("runc", "runsc"):  # a container may outlive its bundle, and the other way round
                oci_runtime.force_delete(runtime, item.name)
        shutil.rmtree(path)
    elif item.kind == "container":
        from sandforge.sandbox import docker_engine

        if api is None or not docker_engine.remove_container(api, item.name):
            raise OSError("the Docker engine did not remove it")
    else:

        oci_runtime.force_delete(item.where, item.name)


def reap(*, apply: bool = True, containers: bool = True) -> list[Leftover]:
    """Find the leftovers of dead owners and (with ``apply``) remove them; each says whether it went."""
    found, api = find(containers=containers)
    if apply:
        for item in found:
            try:
                _remove(item, api)
                item.removed = True
            except OSError as exc:
                item.error = str(exc)
    with contextlib.suppress(Exception):
        if api is not None:
            api.close()
    return found


_LOCK = threading.Lock()
_PENDING: set[bool] = set()  # what the requests since the last pass asked for: True = containers too
_RUNNING = False
#: A subprocess backend starting asks the container engines at most this often (files: every time).
CONTAINER_INTERVAL_S = 60.0
_CONTAINERS_CHECKED = -CONTAINER_INTERVAL_S


def containers_due() -> bool:
    """For backends that run no containers: whether it is time to look at the engines again (each pass
    costs an engine round trip and a runtime start or two, and tests start hundreds of backends)."""
    global _CONTAINERS_CHECKED
    with _LOCK:
        now = time.monotonic()
        if now - _CONTAINERS_CHECKED < CONTAINER_INTERVAL_S:
            return False
        _CONTAINERS_CHECKED = now
        return True


def reap_in_background(*, containers: bool = True) -> None:
    """Reap when a backend starts, on a daemon thread: never on an execution's path. Requests that come
    while a pass runs are served by one more pass after it (so nothing that existed at a start is missed)."""
    global _RUNNING
    with _LOCK:
        _PENDING.add(containers)
        if _RUNNING:
            return
        _RUNNING = True

    def run() -> None:
        global _RUNNING
        while True:
            with _LOCK:
                if not _PENDING:
                    _RUNNING = False
                    return
                with_containers = True in _PENDING
                _PENDING.clear()
            try:
                removed = [item for item in reap(containers=with_containers) if item.removed]
                if removed:
                    log.info("removed %d leftover(s) of dead sandforge processes", len(removed))
            except Exception as exc:  # best effort; a later start or `sandforge cleanup` tries again
                log.debug("reaping leftovers failed: %s", exc)

    threading.Thread(target=run, name="sandforge-leftovers", daemon=True).start()


#: How long after a subprocess backend's start its look at the container engines waits: a short-lived
#: process (``sandforge exec``) has ended by then and never pays for the engines' clients (the Docker SDK's
#: import, an engine round trip, ``runc``/``runsc list``) beside its one execution; a server still looks.
CONTAINER_DELAY_S = 5.0


def reap_containers_later() -> None:
    """:func:`reap_in_background` with the container engines, :data:`CONTAINER_DELAY_S` from now (on a daemon
    timer, so it never keeps a process alive)."""
    timer = threading.Timer(CONTAINER_DELAY_S, reap_in_background)
    timer.name, timer.daemon = "sandforge-leftovers-later", True
    timer.start()


__all__ = ["WORKDIR_PREFIX", "Leftover", "containers_due", "find", "new_workdir", "reap", "reap_containers_later",
           "reap_in_background"]  # fmt: skip
