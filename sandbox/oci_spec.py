"""The OCI runtime spec (``config.json``) of one sandbox container, for runc and runsc driven directly.

It states the same walls the Docker backend asks dockerd for, without dockerd in the path: a read-only
root shared by every container, a size-limited noexec ``/tmp``, new pid/net/ipc/uts/mount/cgroup
namespaces (a network namespace with nothing in it: no network), no capabilities, no-new-privileges, an
unprivileged user, memory (no swap)/pids/CPU limits, masked kernel interfaces, no devices beyond the
runtime's defaults, and a seccomp filter built from the same deny-list as the runner's own. ``execve`` is
left to the runner's filter: the runtime itself must exec the interpreter after applying this one.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from sandforge.sandbox.containers import PYTHON, SCRATCH
from sandforge.sandbox.handoff import MOUNT_POINT as HANDOFF_MOUNT_POINT
from sandforge.sandbox.protocol import ENV_MOUNT_PATH, Limits
from sandforge.sandbox.seccomp import DENIED_SYSCALLS, ENOSYS_SYSCALLS

OCI_VERSION = "1.0.2"
#: Allowed by the runtime-level filter because the runtime needs them to start the container process;
#: the runner's own filter (loaded before any program runs) denies them.
RUNTIME_NEEDS = frozenset({"execve", "execveat"})
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)  # fmt: skip
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
NAMESPACES = ("pid", "network", "ipc", "uts", "mount", "cgroup")
CPU_PERIOD_US = 100_000


def seccomp_profile() -> dict[str, Any]:
    """The runner's deny-list as an OCI seccomp section (EPERM; ENOSYS for clone3 so libc falls back)."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64"],
        "syscalls": [
            {
                "names": [s for s in DENIED_SYSCALLS if s not in RUNTIME_NEEDS],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
            },
            {"names": list(ENOSYS_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ],
    }


def container_spec(
    *,
    rootfs: Path,
    args: list[str],
    limits: Limits,
    uid: int,
    gid: int,
    cgroups_path: str | None,
    memory_headroom_mb: int = 0,
    pids_headroom: int = 0,
    seccomp: bool = True,
    handoff_source: str | None = None,
    env_source: str | None = None,
) -> dict[str, Any]:
    """The full ``config.json``. ``cgroups_path`` None leaves cgroup placement to the runtime;
    ``handoff_source`` is a host hand-off directory to mount read-only (``sandbox/handoff.py``);
    ``env_source`` an environment's site directory, mounted read-only at ``ENV_MOUNT_PATH`` (not noexec: its
    extension modules are mapped executable)."""
    memory = (limits.memory_mb + memory_headroom_mb) * 1024 * 1024
    linux: dict[str, Any] = {
        "namespaces": [{"type": kind} for kind in NAMESPACES],
        "resources": {
            "devices": [{"allow": False, "access": "rwm"}],
            "memory": {"limit": memory, "swap": memory},
            "pids": {"limit": limits.max_processes + pids_headroom},
            "cpu": {"quota": int(limits.cpus * CPU_PERIOD_US), "period": CPU_PERIOD_US},
        },
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
    }
    if cgroups_path is not None:
        linux["cgroupsPath"] = cgroups_path
    if seccomp:
        linux["seccomp"] = seccomp_profile()
    handoff = [
        {"destination": HANDOFF_MOUNT_POINT, "type": "bind", "source": source,
         "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}
        for source in [handoff_source] if source
    ]  # fmt: skip
    handoff += [
        {"destination": ENV_MOUNT_PATH, "type": "bind", "source": source, "options": ["bind", "ro", "nosuid", "nodev"]}
        for source in [env_source] if source
    ]  # fmt: skip
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, "additionalGids": []},
            "args": args,
            "env": [],
            "cwd": SCRATCH,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "noexec", "strictatime", "mode=755", "size=64k"],
            },
            {
                "destination": SCRATCH,
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "noexec", "mode=1777", f"size={limits.disk_mb}m"],
            },
            *handoff,
        ],
        "linux": linux,
    }


__all__ = ["PYTHON", "SCRATCH", "container_spec", "seccomp_profile"]
