"""An environment zygote's own walls, put up before it imports any package (issue 39 item 3): a package's
import-time code then runs where a fresh sandbox would run it, not as the host's user on the host.

The zygote (real root, never having run package code) enters new mount, network, IPC and UTS namespaces;
makes a private read-only root of exactly what its runners bind (the standard library and the system's shared
libraries at their own paths, the environment's site, the time-zone database), a ``/proc`` that shows a
process only itself and what it may trace (``hidepid=invisible,subset=pid``: its runners write their own
id maps there), and an empty ``/w`` where each runner mounts its own tmpfs; pivots into it, with the host's
tree detached (nothing outside is left in the namespace to reach, not even through a nested user
namespace's ``chroot``); drops to the sandbox user with no capability; sets ``no_new_privs``, the run's
rlimits and a seccomp filter: the sandbox's own, minus what its runners need (``clone`` but no thread,
``mount``, ``chroot``, ``capset``), compiled on the host (``sandbox/seccomp.zygote_filter``).

Each runner is cloned straight into namespaces of its own (``lockdown.clone_runner`` of ``RUNNER_NAMESPACES``:
a user namespace whose parent is the host's, so it holds no capability over anything the zygote can see, and
pid, mount, network, IPC and UTS namespaces owned by it: pid 1 at once, no second process), maps its ids,
mounts its own tmpfs root, drops the capabilities and stacks the full sandbox filter on the zygote's
(``lockdown.lock_down`` with ``entered``).
``kill`` stays refused to the zygote: its runners die with it (their parent-death signal).
"""
# ruff: noqa: PTH103
# (the runner avoids pathlib (import cost))

from __future__ import annotations

import base64
import os
import resource
from typing import Any

from .envmodules import private_root_binds
from .idiom_modules import tz_binds
from .lockdown import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    _bind_read_only,
    _check,
    _drop_bounding_set,
    _install_seccomp,
    _libc,
)

#: Where each runner of a confined zygote mounts its own tmpfs root (an empty directory of the zygote's root).
RUNNER_ROOT = "/w"
#: Processes the sandbox user may have at once while a confined zygote forks (a fresh runner may fork none;
#: the zygote forks two per runner): a package's import cannot fork without bound.
MAX_PROCESSES = 1024
#: Descriptors a confined zygote may hold (it moves a runner's four above 100 before wiring them).
ZYGOTE_FILES = 256
PR_SET_CHILD_SUBREAPER, MNT_DETACH = 36, 2
#: pivot_root's system call number per machine; elsewhere a zygote is not confined (its runners' raw clone,
#: ``lockdown.clone_runner``, is not known there either).
SYSCALLS = {"x86_64": 155, "aarch64": 41}
_SYS_PIVOT_ROOT = SYSCALLS.get(os.uname().machine, -1)


#: What a confined zygote's runner is cloned into: namespaces of its own, pid 1 of its pid namespace at once (a
#: rootless runner unshares them and forks a second process to be that pid 1).
RUNNER_NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS


class ConfineFailed(Exception):
    """A wall the zygote could not put up; the message is one line (the host falls back to the plain zygote)."""


def sources(boot: dict[str, Any], site: str) -> list[str]:
    """The host paths a runner of this zygote binds into its own root (so the zygote's root must hold them, at
    the same paths), and the environment's site itself (the zygote imports from it)."""
    child = {"environment": {"bind_source": site}}
    paths = [source for source, _ in private_root_binds(child) + tz_binds()]
    return sorted({*paths, site}, key=lambda p: (p.count(os.sep), p))


def confine(boot: dict[str, Any], site: str) -> dict[str, bool]:
    """Put up every wall of the zygote (see the module doc); the walls up, by name. Raises ConfineFailed."""
    spec = boot.get("confine")
    if not isinstance(spec, dict) or not isinstance(spec.get("root"), str) or os.geteuid() != 0:
        raise ConfineFailed("an environment zygote is confined only when started as root with a root directory")
    if _SYS_PIVOT_ROOT < 0:
        raise ConfineFailed(f"no environment zygote on {os.uname().machine} (its system calls are not known here)")
    libc, limits = _libc(), boot["limits"]
    uid, gid = int(boot.get("drop_to_uid") or 65534), int(boot.get("drop_to_gid") or 65534)
    try:
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
        _private_root(libc, spec["root"], sources(boot, site))
        _drop_bounding_set(libc)  # its runners' user namespaces start with a full set of their own
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # from root: every capability goes with it
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")  # what the import forks stays ours
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _rlimits(limits)
        _install_seccomp(libc, base64.b64decode(spec["seccomp_bpf_b64"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfineFailed(f"confining the zygote: {exc}"[:300]) from None
    return dict.fromkeys(("mount_namespace", "net_namespace", "ipc_namespace", "uts_namespace", "private_root",
                          "unprivileged_user", "no_new_privs", "rlimits", "seccomp"), True)  # fmt: skip


def _private_root(libc: Any, root: str, binds: list[str]) -> None:
    """A tmpfs at ``root`` holding ``binds`` read-only at their own paths, ``/proc`` and ``RUNNER_ROOT``; then
    the process's root, the host's tree detached, the tmpfs itself read-only."""
    _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=1m,mode=0755"),
           "tmpfs")  # fmt: skip
    for source in binds:
        _bind_read_only(libc, source, root + source)
    os.makedirs(root + RUNNER_ROOT, mode=0o755)
    os.makedirs(root + "/proc", mode=0o555)
    _check(libc.mount(b"proc", (root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      b"hidepid=invisible,subset=pid"), "proc")  # fmt: skip
    os.chdir(root)
    _check(libc.syscall(_SYS_PIVOT_ROOT, b".", b"."), "pivot_root")  # the old root is stacked under ".": detach it
    _check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    flags = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(libc.mount(b"tmpfs", b"/", None, flags, None), "read-only root")


def _rlimits(limits: dict[str, Any]) -> None:
    """The run's rlimits, but processes (bounded, not none: the zygote forks), descriptors (at least
    ``ZYGOTE_FILES``) and CPU (the import's budget is a run's, counted from now; the zygote's forks spend from it
    too, and one that has spent it is rebuilt)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime) + int(limits.get("cpu_s") or int(limits["timeout_s"]) + 1)
    for res, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, int(limits["memory_mb"]) * 1024 * 1024),
        (resource.RLIMIT_FSIZE, int(limits["disk_mb"]) * 1024 * 1024),
        (resource.RLIMIT_NOFILE, max(int(limits["max_open_files"]), ZYGOTE_FILES)),
        (resource.RLIMIT_NPROC, MAX_PROCESSES),
    ):
        resource.setrlimit(res, (value, value))


def strays() -> list[int]:
    """Processes the import left running (forked, or orphaned to us: the zygote is their subreaper)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []
