"""Whose is it: names that tie what a process leaves behind to that process, across pid reuse.

A host killed with SIGKILL cleans nothing up, so everything it creates (work and hand-off directories,
containers, bundles) carries its owner's name, and a reaper (``sandbox/leftovers.py``) removes what belongs
to a process that is gone. Two forms exist: the ``process_tag`` (``<pid>-<start time>``, in file and OCI
container names) and the host-qualified owner of a Docker container's label (the engine may be shared).
"""

from __future__ import annotations

import os
import socket

import psutil

_OWN_TAG: tuple[int, str] | None = None


def process_tag(pid: int | None = None) -> str:
    """``<pid>-<start time>`` of a process (this one by default): names what it leaves behind (container
    ids, directories) so that a reaper can tell, across pid reuse, whether their owner is still alive."""
    global _OWN_TAG
    if pid is None:
        own = _OWN_TAG
        if own is not None and own[0] == os.getpid():
            return own[1]
        _OWN_TAG = own = (os.getpid(), process_tag(os.getpid()))
        return own[1]
    return f"{pid}-{int(psutil.Process(pid).create_time() * 100)}"


def tag_alive(tag: str) -> bool:
    """Whether the process a ``process_tag`` names is still running."""
    try:
        return process_tag(int(tag.partition("-")[0])) == tag
    except (ValueError, psutil.Error):
        return False


def named_owner_alive(name: str, prefix: str) -> bool:
    """Whether the owner of ``<prefix>-<pid>-<start time>-<n>`` (an OCI container or bundle) is alive; a
    name of another form is not ours, so it counts as alive (never touched)."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != prefix:
        return True  # not ours
    return tag_alive(f"{parts[1]}-{parts[2]}")


def host_owner() -> str:
    """``<hostname>:<pid>:<start time>`` of this process: a Docker container's owner label (an engine may
    serve several machines, so the host is part of the name)."""
    proc = psutil.Process()
    return f"{socket.gethostname()}:{proc.pid}:{proc.create_time():.2f}"


def host_owner_alive(owner: str) -> bool:
    """Whether a ``host_owner`` is still running; another machine's is not ours to judge (alive)."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname():
        return True  # another machine's container: not ours to judge
    try:
        proc = psutil.Process(int(pid_text))
        return f"{proc.create_time():.2f}" == started
    except (ValueError, psutil.Error):
        return False


__all__ = ["host_owner", "host_owner_alive", "named_owner_alive", "process_tag", "tag_alive"]
