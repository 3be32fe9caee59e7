"""What the host itself can see of a sandbox's walls, organised by mechanism, for every backend.

A runner's claims about its own lock-down count only where the host confirms them: each function here reads
``/proc`` (or the cgroup filesystem) of a sandbox process and says whether one mechanism is in force. The
backends compose them into their protections (``sandbox/protections.py`` says which each provides):
subprocess and runc check the program's process, runsc the gVisor sandbox process, docker (runc) the
container's process when this machine sees it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from sandforge.sandbox.protections import Protection


def read_proc(path: str) -> str:
    """A small ``/proc`` file's text, read with bare system calls (no buffered text file: its ``fstat``,
    ``ioctl`` and ``lseek`` cost more than the read, on every worker's start); raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 16384)]
        while chunks[-1]:
            chunks.append(os.read(fd, 16384))
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


#: One ``/proc/<pid>/status`` line: its key and its value, blanks around the value left out.
_STATUS_LINE = re.compile(r"^([^:\n]*):[ \t]*(.*?)[ \t]*$", re.MULTILINE)


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a mapping (empty when unreadable: every check below then fails). Parsed by
    one regular expression, not line by line in Python (its ~60 lines, on every worker's start)."""
    try:
        return dict(_STATUS_LINE.findall(read_proc(f"/proc/{pid}/status")))
    except OSError:
        return {}


# --- namespaces -------------------------------------------------------------------------------------------

#: ``/proc/<pid>/ns`` names of the namespaces every sandbox is in, and the protection each gives.
NAMESPACES: dict[str, Protection] = {
    "net": Protection.NET_NAMESPACE,
    "mnt": Protection.MOUNT_NAMESPACE,
    "ipc": Protection.IPC_NAMESPACE,
    "uts": Protection.UTS_NAMESPACE,
    "pid": Protection.PID_NAMESPACE,
}


def namespace(pid: int | str, kind: str) -> str | None:
    """The ``/proc/<pid>/ns/<kind>`` link (``pid`` may be ``"self"``), or None when unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")  # noqa: PTH115 - not ``Path``: each worker start reads six
    except OSError:
        return None


_OWN_NAMESPACES: dict[tuple[str, int], str] = {}


def _own_namespace(kind: str) -> str | None:
    """This process's own namespace of ``kind``: read once per process (a forked child reads its own), since
    the host never moves between namespaces. A failed read is not kept: it is tried again next time."""
    key = (kind, os.getpid())
    own = _OWN_NAMESPACES.get(key)
    if own is None and (own := namespace("self", kind)) is not None:
        _OWN_NAMESPACES[key] = own
    return own


def held_namespace(fd: int, kind: str) -> str | None:
    """The link text (``net:[4026532...]``) of the namespace ``fd`` holds (opened from ``/proc/<pid>/ns/<kind>``):
    its inode, by ``fstat``, without a second path walk through ``/proc``; None when unreadable."""
    try:
        return f"{kind}:[{os.fstat(fd).st_ino}]"
    except OSError:
        return None


def separate_namespaces(
    pid: int, kinds: tuple[str, ...] = tuple(NAMESPACES), held: dict[str, int] | None = None
) -> dict[str, bool]:
    """For each kind: whether ``pid`` is in a namespace of its own (not the host's, as far as this process
    is the host's). ``held``: descriptors of ``pid``'s namespaces the caller opened already, by kind."""
    held = held or {}
    return {
        kind: (theirs := held_namespace(held[kind], kind) if kind in held else namespace(pid, kind)) is not None
        and theirs != _own_namespace(kind)
        for kind in kinds
    }


# --- rlimits ----------------------------------------------------------------------------------------------


def rlimits_set(pid: int) -> bool:
    """CPU time, address space, file size, open files and processes are limited, and core dumps are off."""
    try:
        text = read_proc(f"/proc/{pid}/limits")
    except OSError:
        return False
    limits = {line[:26].strip(): line[26:].split() for line in text.splitlines()[1:]}
    needed = ("Max cpu time", "Max address space", "Max file size", "Max open files", "Max processes")
    return (
        all(name in limits and limits[name][0] != "unlimited" for name in needed)
        and limits.get("Max core file size", ["1"])[0] == "0"
    )


# --- seccomp and no_new_privs -----------------------------------------------------------------------------


def seccomp_filtered(status: dict[str, str]) -> bool:
    """A seccomp filter (mode 2) is installed."""
    return status.get("Seccomp") == "2"


def no_new_privs(status: dict[str, str]) -> bool:
    return status.get("NoNewPrivs") == "1"


# --- the user and its capabilities ------------------------------------------------------------------------


def uids(status: dict[str, str]) -> list[str]:
    """Real, effective, saved and filesystem uids as the host sees them ("0" when unreadable)."""
    return status.get("Uid", "0").split()


def non_root(ids: list[str]) -> bool:
    return bool(ids) and all(u != "0" for u in ids)


def inner_uids(pid: int, ids: list[str]) -> list[str]:
    """``ids`` (as the host sees them) translated into ``pid``'s user namespace; "0" when unmapped or
    unreadable, so that doubt counts as root."""
    try:
        ranges = [
            [int(x) for x in line.split()] for line in read_proc(f"/proc/{pid}/uid_map").splitlines() if line.strip()
        ]
    except (OSError, ValueError):
        return ["0"]
    inner: list[str] = []
    for text in ids:
        outer = int(text)
        match = [first + outer - lower for first, lower, count in ranges if lower <= outer < lower + count]
        inner.append(str(match[0]) if match else "0")
    return inner


def no_capabilities(status: dict[str, str], kinds: tuple[str, ...]) -> bool:
    """No capability in any of the sets ``kinds`` (``Inh``, ``Prm``, ``Eff``, ``Amb``, ``Bnd``)."""
    try:
        return all(int(status.get(f"Cap{kind}", "1"), 16) == 0 for kind in kinds)
    except ValueError:
        return False


# --- cgroups ----------------------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_paths(pid: int) -> dict[str, str]:
    """Controller -> cgroup path of ``pid`` (v1 hierarchies by controller name, v2 under ``""``)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def in_cgroup_of(pid: int, container_id: str) -> bool:
    """``pid`` is (still) a process of that container, not a reused pid: its cgroup names the container."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return container_id in fh.read()
    except OSError:
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_limits(pid: int) -> dict[str, int | None]:
    """The memory (and memory+swap), pids and CPU quota limits of ``pid``'s cgroups; None when unlimited."""
    root = CGROUP_ROOT
    paths = cgroup_paths(pid)

    def number(text: str | None) -> int | None:
        return int(text) if text and text.lstrip("-").isdigit() and int(text) > 0 and len(text) < 19 else None

    if "" in paths and (root / paths[""].lstrip("/") / "memory.max").exists():  # cgroup v2
        base = root / paths[""].lstrip("/")
        memory = number(_read(base / "memory.max"))
        swap = number(_read(base / "memory.swap.max"))
        cpu = _read(base / "cpu.max") or "max"
        return {
            "memory": memory,
            "memory_swap": memory + (swap or 0) if memory and swap is not None else None,
            "pids": number(_read(base / "pids.max")),
            "cpu_quota": number(cpu.split()[0]),
        }
    memory_dir = root / "memory" / paths.get("memory", "/").lstrip("/")
    return {
        "memory": number(_read(memory_dir / "memory.limit_in_bytes")),
        "memory_swap": number(_read(memory_dir / "memory.memsw.limit_in_bytes")),
        "pids": number(_read(root / "pids" / paths.get("pids", "/").lstrip("/") / "pids.max")),
        "cpu_quota": number(_read(root / "cpu" / paths.get("cpu", "/").lstrip("/") / "cpu.cfs_quota_us")),
    }


# --- mounts, the root and the network ---------------------------------------------------------------------


def mounts(pid: int) -> dict[str, tuple[str, str]]:
    """Mount point -> (filesystem type, all options) in ``pid``'s mount namespace."""
    out: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 6 and len(rfields) >= 3:
                out[fields[4]] = (rfields[0], f"{fields[5]},{rfields[2]}")
    return out


def tmpfs_root(pid: int) -> bool:
    """``pid``'s root is not the host's, and its mount table shows a tmpfs as its root."""
    try:
        root = os.readlink(f"/proc/{pid}/root")  # noqa: PTH115 - on every worker's start
        table = [line.split() for line in read_proc(f"/proc/{pid}/mountinfo").splitlines()]
    except OSError:
        return False
    on_root = [f[f.index("-") + 1] for f in table if len(f) > 4 and f[4] == "/" and "-" in f[5:]]
    return root != "/" and bool(on_root) and on_root[-1] == "tmpfs"  # the last mount on "/" is the one seen


def other_root(pid: int) -> bool:
    """``pid``'s root directory is not the host's (compared by device and inode, through ``/proc``)."""
    try:
        theirs, ours = Path(f"/proc/{pid}/root").stat(), Path("/").stat()
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino)


def only_loopback(pid: int) -> bool:
    """Only a loopback interface in ``pid``'s network namespace."""
    try:
        with open(f"/proc/{pid}/net/dev") as fh:
            names = [line.split(":", 1)[0].strip() for line in fh.readlines()[2:]]
    except OSError:
        return False
    return names == ["lo"] or names == []


# --- the walls a runner raises itself, as the host sees them ----------------------------------------------


def process_walls(pid: int, status: dict[str, str] | None = None) -> dict[str, bool]:
    """The runner's own lock-down of ``pid`` (seccomp, no_new_privs, rlimits, a non-root user) from ``/proc``
    (``status``: its ``proc_status`` if already read): what a container backend confirms of the runner's
    claims where this machine sees the process."""
    status = proc_status(pid) if status is None else status
    return {
        Protection.SECCOMP: seccomp_filtered(status),
        Protection.NO_NEW_PRIVS: no_new_privs(status),
        Protection.RLIMITS: rlimits_set(pid),
        Protection.UNPRIVILEGED_USER: non_root(uids(status)),
    }
