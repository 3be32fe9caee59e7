"""The in-sandbox runner: the only sandforge code that runs inside the sandbox.

It needs nothing but the standard library and RestrictedPython, and it is copied into the container image
unchanged. One runner process serves exactly one execution:

1. read a ``boot`` frame, import what the program may use, lock the process down (rlimits, namespaces,
   private tmpfs root, dropped privileges, no_new_privs, seccomp), then report ``ready``;
2. read one ``execute`` frame (and one frame per context key after it), run the program under
   RestrictedPython, answer nested ``call`` frames;
3. write exactly one ``result`` frame (and one frame per context key the program changed) and exit.

Frames are a 4-byte big-endian length plus UTF-8 JSON. The context travels key by key, each key's JSON text
in its own frame, and stays undecoded until the program reads that key (see ``LazyContext``): carrying
state a program does not touch costs moving its bytes, nothing more. Where fd 0 is a unix socket, the
largest texts are not moved at all: each is a sealed memfd attached to the execute frame, checked and
mapped read-only (``read_execute``, ``map_text``); in a container run by dockerd, where fd 0 is a pipe,
they are files in a read-only hand-off directory the host confirmed at boot (``handoff_ready``).

Results go to a dedicated channel (``--result-fd N``, or in a container the original stdout, which the
runner re-points at stderr before any program runs), so printing can never forge a result: ``print``
output is captured, bounded, into the result's ``stdout``.

The OS boundary is the security boundary; RestrictedPython here is defence in depth.
"""

from __future__ import annotations

import array
import ast
import base64
import builtins as py_builtins
import collections.abc
import contextlib
import ctypes
import errno
import fcntl
import json
import marshal
import mmap
import os
import resource
import select
import signal
import socket
import stat
import string
import struct
import sys
import threading
import types
import warnings
from importlib.util import MAGIC_NUMBER
from typing import Any

RUNNER_VERSION = "3"
#: The wire protocol this runner speaks (``sandbox.protocol.PROTOCOL_VERSION`` on the host).
PROTOCOL_VERSION = 3
#: At most this many descriptors (sealed memfds of context values) come with the execute frame.
MAX_PASSED_FDS = 16
#: What makes a passed memfd immutable: no writes, no shrinking, no growing, by anyone.
REQUIRED_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
HEADER = struct.Struct(">I")
TOOL_FILENAME = "<tool>"
TOOL_FUNCTION = "sandforge_tool"

#: What a program may import. Each is imported before lock-down and exposed through a read-only proxy that
#: hides sub-modules and private names, so e.g. ``typing.sys`` or ``random._os`` cannot be reached.
ALLOWED_MODULES: dict[str, frozenset[str]] = {
    # module name -> public names withheld from the proxy (bypass attribute guards or touch files)
    "base64": frozenset(),
    "bisect": frozenset(),
    "calendar": frozenset(),
    "cmath": frozenset(),
    "collections": frozenset(),
    "copy": frozenset(),
    "csv": frozenset(),
    "datetime": frozenset(),
    "decimal": frozenset(),
    "fractions": frozenset(),
    "functools": frozenset(),
    "hashlib": frozenset({"file_digest"}),
    "heapq": frozenset(),
    "html": frozenset(),
    "html.parser": frozenset(),
    "itertools": frozenset(),
    "json": frozenset({"load", "dump"}),
    "math": frozenset(),
    "operator": frozenset({"attrgetter", "methodcaller"}),
    "random": frozenset(),
    "re": frozenset(),
    "statistics": frozenset(),
    "string": frozenset({"Formatter"}),
    "textwrap": frozenset(),
    "time": frozenset(),
    "unicodedata": frozenset(),
    "urllib.parse": frozenset(),
    "xml.etree.ElementTree": frozenset({"parse", "iterparse", "ElementTree", "XMLPullParser"}),
}

# Linux constants (x86_64 and aarch64 agree on these).
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_GET_PDEATHSIG = 2
#: The runner's own wall-clock backstop: SIGALRM (default action: terminate) this long after the host's
#: deadline, paused while a nested call is answered. The host kills at its deadline; this only matters when
#: the host cannot (killed, hung).
BACKSTOP_GRACE_S = 2.0
#: The frames-in channel, watched for the host's hang-up by the pid-namespace parent (``_become_pid1``).
_HOST_CHANNEL_FD: int | None = None
SECCOMP_MODE_FILTER = 2


class OutputLimitExceeded(Exception):
    """The program printed more than the output limit allows."""


# --- framing ------------------------------------------------------------------------------------------


class Channel:
    """The frames-in channel (fd 0): a pipe (frames only) or a unix stream socket, which may also carry
    descriptors (SCM_RIGHTS). Every read from a socket collects what came attached to the bytes read, so
    a descriptor can never arrive unnoticed; ``take_fds`` hands them over (and ``truncated`` says the
    kernel dropped some: more came than ``MAX_PASSED_FDS`` or the open-files limit allows)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sock: socket.socket | None = None
        self.fds: list[int] = []
        self.truncated = False
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            self.sock = socket.socket(fileno=fd)

    def readinto(self, view: memoryview) -> int:
        if self.sock is None:
            return os.readv(self.fd, [view])
        got, ancillary, flags, _ = self.sock.recvmsg_into([view], socket.CMSG_SPACE(MAX_PASSED_FDS * 4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            self.truncated = True
        return got

    def take_fds(self) -> tuple[list[int], bool]:
        fds, truncated = self.fds, self.truncated
        self.fds, self.truncated = [], False
        return fds, truncated


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _read_exact(src: int | Channel, size: int) -> bytearray:
    """Exactly ``size`` bytes, read straight into one buffer (a 10 MB context is copied once, not twice)."""
    buf = bytearray(size)
    view = memoryview(buf)
    pos = 0
    while pos < size:
        chunk = view[pos : pos + (1 << 20)]
        got = src.readinto(chunk) if isinstance(src, Channel) else os.readv(src, [chunk])
        if not got:
            raise EOFError("channel closed")
        pos += got
    return buf


def read_raw_frame(src: int | Channel, max_bytes: int) -> bytearray:
    (size,) = HEADER.unpack(_read_exact(src, HEADER.size))
    if size > max_bytes:
        raise ValueError(f"frame of {size} bytes exceeds the limit")
    return _read_exact(src, size)


def read_frame(src: int | Channel, max_bytes: int) -> dict[str, Any]:
    frame = json.loads(read_raw_frame(src, max_bytes))
    if not isinstance(frame, dict):
        raise ValueError("frame is not an object")
    return frame


class PassedTextError(ValueError):
    """The host's descriptors do not match what the execute frame announces: an invalid request."""


class MappedText:
    """A context key's JSON text in a sealed memfd, mapped read-only; copied out once, on first use."""

    __slots__ = ("map", "size", "text")

    def __init__(self, mapped: mmap.mmap | None, size: int) -> None:
        self.map, self.size, self.text = mapped, size, b"" if mapped is None else None

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        if self.text is None:
            assert self.map is not None
            self.text = self.map[:]
            self.map.close()
            self.map = None
        return self.text


def map_text(fd: int, size: int, *, sealed: bool = True) -> MappedText:
    """Check that ``fd`` is a regular file of exactly ``size`` bytes (and, for a passed descriptor, a memfd
    sealed against writing, growing and shrinking) and map it read-only; PassedTextError otherwise. The
    caller still owns (and closes) ``fd``."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS) if sealed else REQUIRED_SEALS
        info = os.fstat(fd)
    except OSError as exc:
        raise PassedTextError(f"a passed descriptor is not a sealed memfd ({exc.strerror})") from None
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise PassedTextError("a passed descriptor is not sealed against writing and resizing")
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        raise PassedTextError(f"a passed value holds {info.st_size} bytes, announced {size}")
    if size == 0:
        return MappedText(None, 0)
    try:
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        raise PassedTextError(f"a passed value cannot be mapped: {exc}") from None
    return MappedText(mapped, size)


def handoff_ready(boot: dict[str, Any]) -> str | None:
    """The boot frame's hand-off directory if it holds the boot frame's token (the host's path is really
    what is mounted here), else None: values then come as frames."""
    where, token = boot.get("handoff_dir"), boot.get("handoff_token")
    if not (isinstance(where, str) and isinstance(token, str) and token):
        return None
    try:
        with open(f"{where}/token", "rb") as fh:
            return where if fh.read(len(token) + 1) == token.encode() else None
    except OSError:
        return None


def open_handoff(where: str, index: int, size: int) -> MappedText:
    """Value ``index`` of a hand-off directory, mapped read-only (never through a symlink)."""
    try:
        fd = os.open(f"{where}/{index}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise PassedTextError(f"handed-off value {index} cannot be opened ({exc.strerror})") from None
    try:
        return map_text(fd, size, sealed=False)
    finally:
        os.close(fd)


ContextText = bytearray | MappedText


def read_execute(
    src: int | Channel, max_bytes: int, handoff: str | None = None
) -> tuple[dict[str, Any], dict[str, ContextText]]:
    """The execute frame and the context keys' texts that follow it, undecoded, within ``max_bytes`` in all.

    A key announced as ``[key, length, i]`` is descriptor ``i`` of those attached to the execute frame
    (a sealed memfd, mapped read-only) rather than a frame, or with a ``handoff`` directory its file ``i``;
    any other descriptor is closed and refused."""
    frame = read_frame(src, max_bytes)
    fds, truncated = src.take_fds() if isinstance(src, Channel) else ([], False)
    raw: dict[str, ContextText] = {}
    try:
        _context_texts(src, frame, fds, truncated, max_bytes, raw, handoff)
        return frame, raw
    except BaseException:
        for text in raw.values():
            if isinstance(text, MappedText) and text.map is not None:
                text.map.close()
        raise
    finally:
        close_fds(fds)  # mapped ones stay readable through their mapping
        if isinstance(src, Channel):
            close_fds(src.take_fds()[0])


def _context_texts(
    src: int | Channel, frame: dict[str, Any], fds: list[int], truncated: bool, max_bytes: int,
    raw: dict[str, ContextText], handoff: str | None,
) -> None:  # fmt: skip
    keys = frame.get("context_keys", [])
    if not isinstance(keys, list):
        raise ValueError("context_keys is not a list")
    if truncated:
        raise PassedTextError(f"more descriptors than the {MAX_PASSED_FDS} a request may pass")
    budget = max_bytes
    used: set[int] = set()
    for entry in keys:
        if not (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)
                and type(entry[1]) is int and 0 <= entry[1] <= budget and entry[0] not in raw):  # fmt: skip
            raise ValueError("malformed context key announcement")
        if len(entry) == 3:
            index = entry[2]
            passed = MAX_PASSED_FDS if handoff is not None else len(fds)
            if type(index) is not int or not 0 <= index < passed or index in used:
                raise PassedTextError(f"context key {entry[0]!r} names descriptor {index!r}, which was not passed")
            used.add(index)
            if handoff is not None:
                raw[entry[0]] = open_handoff(handoff, index, entry[1])
            else:
                raw[entry[0]] = map_text(fds[index], entry[1])
        else:
            body = read_raw_frame(src, budget)
            if len(body) != entry[1]:
                raise ValueError(f"context key {entry[0]!r} is {len(body)} bytes, announced {entry[1]}")
            raw[entry[0]] = body
        budget -= entry[1]
    unannounced = len(fds) if handoff is not None else len(fds) - len(used)
    if unannounced:
        raise PassedTextError(f"{unannounced} passed descriptors are not announced")
    if isinstance(src, Channel) and src.fds:
        raise PassedTextError("descriptors came with a context frame, not with the execute frame")


def _json_default(value: Any) -> Any:
    """``json.dumps``' hook: a LazyContext is encoded as the dict it stands for; nothing else is JSON."""
    if type(value) is LazyContext:
        return value._resolved()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode(frame: dict[str, Any]) -> bytes:
    text = json.dumps(frame, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)
    return text.encode()


def write_frame(fd: int, frame: dict[str, Any] | bytes) -> None:
    body = frame if isinstance(frame, bytes) else encode(frame)
    write_all(fd, HEADER.pack(len(body)) + body)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# --- lock-down ----------------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write_file(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


#: Why the runner could not enter its outer user namespace before exec (rootless mode; see ``main``).
USERNS_ERRORS: list[str] = []
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
NAMESPACE_NAMES = ["net_namespace", "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace"]


def _map_ids(inner: tuple[int, int], outer: tuple[int, int]) -> None:
    """In a fresh user namespace, map our own (outer) ids to the given inner ones: the one mapping an
    unprivileged process may write. Must run while the process is still dumpable, or /proc/self/*
    belongs to root and the writes fail with EACCES."""
    _write_file("/proc/self/setgroups", "deny")  # required before gid_map without CAP_SETGID outside
    _write_file("/proc/self/uid_map", f"{inner[0]} {outer[0]} 1")
    _write_file("/proc/self/gid_map", f"{inner[1]} {outer[1]} 1")


def _uid_mapped(uid: int) -> bool:
    """Whether ``uid`` exists in our user namespace (root on the host: always; in a user namespace: rarely)."""
    try:
        with open("/proc/self/uid_map") as fh:
            ranges = [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except (OSError, ValueError):
        return False
    return any(first <= uid < first + count for first, _, count in ranges)


def _drop_bounding_set(libc: ctypes.CDLL) -> None:
    """Empty the capability bounding set (needs CAP_SETPCAP: before setuid as root, or in the user namespace),
    so that nothing could ever bring a capability back, even through an exec that seccomp already denies."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the kernel's last capability
                break
            _check(-1, f"drop capability {cap} from the bounding set")


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """Give up every capability the user namespace granted: bounding set, ambient set, then all three sets.

    The uid is already the unprivileged inner one, so no setuid clears them as it does for root."""
    _drop_bounding_set(libc)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _private_root(libc: ctypes.CDLL, workdir: str, disk_mb: int, owner: tuple[int, int]) -> None:
    """Mount a size-limited tmpfs on the (empty, private) workdir and make it the process's root."""
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    opts = f"size={disk_mb}m,mode=0700,uid={owner[0]},gid={owner[1]},nr_inodes=4096".encode()
    _check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts), "tmpfs")
    os.chdir(workdir)
    os.chroot(".")
    os.chdir("/")


def _parent_death_signal(libc: ctypes.CDLL) -> int:
    """The parent-death signal in force (0: none). A change of credentials (setuid, a new user namespace)
    clears it, so it is read before each such change and set again after (``_rearm_parent_death``)."""
    value = ctypes.c_int(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


def _rearm_parent_death(libc: ctypes.CDLL, sig: int) -> None:
    if sig:
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _wait_or_hang_up(pid: int, watch: int | None) -> int:
    """Wait for ``pid``; if the host hangs up the frames-in channel first (it died), kill ``pid`` then."""
    if watch is not None and hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        if pidfd >= 0:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.register(watch, select.POLLRDHUP)
            done = False
            while not done:
                try:
                    events = poller.poll()
                except InterruptedError:
                    continue
                for fd, event in events:
                    if fd == pidfd:
                        done = True
                    elif event & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)  # the host is gone: nobody wants the result
                        done = True
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except InterruptedError:
            continue


def _become_pid1(libc: ctypes.CDLL) -> None:
    """After unshare(CLONE_NEWPID), fork so the executing process is pid 1 of the new namespace.

    The parent keeps only the frames-in channel open, to watch it: it waits and mirrors the child's exit,
    so the host sees one status, and kills the child when the host hangs up (a killed host leaves nothing
    running). The child dies with the parent (its parent-death signal, re-armed after each privilege change).
    """
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        return
    watch = _HOST_CHANNEL_FD
    if watch is None:
        os.closerange(0, 4096)
    else:
        if watch > 0:  # closerange(0, 0) would close everything (close_range with last = -1)
            os.closerange(0, watch)
        os.closerange(watch + 1, 4096)
    status = _wait_or_hang_up(pid, watch)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _set_rlimits(limits: dict[str, Any]) -> None:
    cpu = int(limits.get("cpu_s") or int(limits["timeout_s"]) + 1)
    memory = int(limits["memory_mb"]) * 1024 * 1024
    disk = int(limits["disk_mb"]) * 1024 * 1024
    files = int(limits["max_open_files"])
    for res, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, disk),
        (resource.RLIMIT_NOFILE, files),
        (resource.RLIMIT_NPROC, 0),
    ):
        resource.setrlimit(res, (value, value))


def _install_seccomp(libc: ctypes.CDLL, bpf: bytes) -> None:
    """Load a classic-BPF filter compiled on the host by libseccomp (8 bytes per instruction)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    if not bpf or len(bpf) % 8:
        raise ValueError("seccomp program has the wrong size")
    prog = SockFprog(len(bpf) // 8, bpf)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def lock_down(boot: dict[str, Any]) -> tuple[dict[str, bool], list[str]]:
    """Apply every protection the boot frame asks for; report what is active and what failed.

    Two ways to the same walls. As real root: new namespaces, private root, then setuid to the sandbox
    user. Otherwise (rootless): a user namespace first, mapping our id to the sandbox uid inside, then the
    other namespaces and the private root with the capabilities it grants, then those capabilities dropped.
    The dumpable flag is cleared only after the id maps are written (``/proc/self`` turns root-owned)."""
    libc = _libc()
    active: dict[str, bool] = {}
    errors: list[str] = list(USERNS_ERRORS)
    limits = boot["limits"]
    uid, gid = boot.get("drop_to_uid"), boot.get("drop_to_gid")
    inner = (uid if uid is not None else 65534, gid if gid is not None else 65534)
    as_root = os.geteuid() == 0 and _uid_mapped(inner[0])
    owner = inner if not as_root and boot.get("namespaces") else (uid or 0, gid or 0)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    pid_ns = in_userns = False
    if boot.get("namespaces"):
        death_signal = _parent_death_signal(libc)
        try:
            if not as_root:
                # Rootless: a user namespace of our own, mapping our id to the sandbox uid inside. The
                # namespaces created next belong to it; the capabilities it grants mount the private root
                # and are then dropped (``_drop_capabilities``).
                outer = (os.geteuid(), os.getegid())  # before unshare: inside, they read as the overflow id
                _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
                in_userns = True  # from here on there are capabilities to drop, even if the maps fail
                _map_ids(inner, outer)
                active["user_namespace"] = True
            _check(libc.unshare(NAMESPACE_FLAGS), "unshare(net, mount, ipc, uts, pid)")
            active.update(dict.fromkeys(NAMESPACE_NAMES, True))
            pid_ns = True
        except OSError as exc:
            errors.append(f"namespaces: {exc}")
        _rearm_parent_death(libc, death_signal)  # a new user namespace clears it
    workdir = boot.get("workdir")
    if boot.get("chroot") and workdir and pid_ns:
        try:
            _private_root(libc, workdir, int(limits["disk_mb"]), owner)
            active["private_root"] = True
        except OSError as exc:
            errors.append(f"private root: {exc}")
    elif workdir:
        with contextlib.suppress(OSError):
            os.chdir(workdir)
    if pid_ns:
        _become_pid1(libc)
    if as_root and uid is not None and gid is not None:
        death_signal = _parent_death_signal(libc)
        try:
            _drop_bounding_set(libc)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            active["unprivileged_user"] = True
        except OSError as exc:
            errors.append(f"drop privileges: {exc}")
        _rearm_parent_death(libc, death_signal)  # setuid/setgid clear it
    elif in_userns:
        death_signal = _parent_death_signal(libc)
        try:
            _drop_capabilities(libc)
            active["unprivileged_user"] = os.geteuid() != 0
        except OSError as exc:
            errors.append(f"drop capabilities: {exc}")
        _rearm_parent_death(libc, death_signal)  # a credential change may clear it
    elif os.geteuid() != 0:
        active["unprivileged_user"] = True
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the last credential change, which may reset it
    try:
        _set_rlimits(limits)
        active["rlimits"] = True
    except (OSError, ValueError) as exc:
        errors.append(f"rlimits: {exc}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        active["no_new_privs"] = True
    if boot.get("seccomp_bpf_b64"):
        try:
            _install_seccomp(libc, base64.b64decode(boot["seccomp_bpf_b64"]))
            active["seccomp"] = True
        except (OSError, ValueError) as exc:
            errors.append(f"seccomp: {exc}")
    return active, errors


# --- the inner wall: what each allowed module exposes, and what the runner checks around the program --------
#
# Every public callable of every allowed module was audited (docs/security.md, "The inner wall's real
# guarantees") for: attribute access with caller-chosen names, eval/exec/compile of caller strings, file or
# descriptor opening, implicit calls with runner objects, and process-global side effects. What failed the
# audit is withheld (WITHHELD_NAMES) or replaced (MODULE_WRAPPERS); a module added to ALLOWED_MODULES must be
# audited the same way and listed in AUDITED_MODULES (a test enforces it).

#: Allowed modules whose whole public surface has been audited (see docs/security.md).
AUDITED_MODULES = frozenset({
    "base64", "bisect", "calendar", "cmath", "collections", "copy", "csv", "datetime", "decimal", "fractions",
    "functools", "hashlib", "heapq", "html", "html.parser", "itertools", "json", "math", "operator", "random",
    "re", "statistics", "string", "textwrap", "time", "unicodedata", "urllib.parse", "xml.etree.ElementTree",
    # audited by issue 15 (h-compat's COMPAT_MODULES, with their own withheld names)
    "abc", "dataclasses", "enum", "io", "typing",
})  # fmt: skip

#: Public names the audit withholds, per module, with the reason a program is told when it uses one. These
#: come on top of ALLOWED_MODULES' own withheld names (same effect, same message).
WITHHELD_NAMES: dict[str, dict[str, str]] = {
    "base64": {
        "main": "reads the runner's protocol channel (sys.stdin) and sys.argv",
        "test": "reads the runner's protocol channel (sys.stdin) and sys.argv",
    },
    "calendar": {
        "main": "parses a command line and writes to the runner's own stdout",
        "different_locale": "changes the process-wide locale",
        "LocaleTextCalendar": "changes the process-wide locale",
        "LocaleHTMLCalendar": "changes the process-wide locale",
    },
    "copy": {"dispatch_table": "a process-wide registry whose entries copy() calls, setting attributes by name"},
    "datetime": {"datetime_CAPI": "a raw C-API capsule"},
    "functools": {
        "update_wrapper": "copies and updates attributes named by the caller (such as __globals__)",
        "singledispatch": "evaluates annotations with eval() outside the sandbox's compiler",
        "singledispatchmethod": "evaluates annotations with eval() outside the sandbox's compiler",
        "WRAPPER_ASSIGNMENTS": "only meaningful for update_wrapper",
        "WRAPPER_UPDATES": "only meaningful for update_wrapper",
        "GenericAlias": "builds aliases of arbitrary objects that forward attribute reads",
        "RLock": "a threading primitive",
        "get_cache_token": "an abc-internal token",
        "recursive_repr": "wraps special methods by name",
    },
    "time": {
        "clock_settime": "sets the system clock",
        "clock_settime_ns": "sets the system clock",
        "tzset": "re-reads the process environment and changes process-wide state",
    },
    "xml.etree.ElementTree": {"dump": "writes to the runner's own stdout; use tostring()"},
}

_STRINGY = (str, bytes, bytearray, int, os.PathLike)
_MISSING_ARG: Any = object()


class SandboxViolation(Exception):
    """The program used something the inner wall refuses. Sticky: recorded in ``VIOLATIONS`` when raised,
    so catching it does not help; the execution ends as ``sandbox_violation`` whatever it returns."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        if len(VIOLATIONS) < 16:
            VIOLATIONS.append(message[:1000])


#: The violations of this execution (one runner process serves one execution).
VIOLATIONS: list[str] = []


def withheld(module: str) -> dict[str, str]:
    """Every name withheld from ``module``'s proxy, with its reason."""
    names = dict.fromkeys(ALLOWED_MODULES.get(module, ()), "it bypasses the attribute guards or touches files")
    names.update(WITHHELD_NAMES.get(module, {}))
    exposed = EXPOSED_ONLY.get(module)
    if exposed is not None and module in sys.modules:  # allow-listed modules: everything else is withheld
        for name in vars(sys.modules[module]):
            if not name.startswith("_") and name not in exposed:
                names.setdefault(name, f"only {', '.join(sorted(exposed))} of {module} are available")
    return names


def withheld_name(module: str, name: str) -> SandboxViolation:
    reason = withheld(module).get(name, "it is not part of the audited surface")
    return SandboxViolation(
        f"module {module!r} has no attribute {name!r}: {module}.{name} is withheld in the sandbox: {reason}"
    )


def _safe_wraps(wrapped: Any, assigned: Any = _MISSING_ARG, updated: Any = _MISSING_ARG) -> Any:
    """``functools.wraps`` for decorators: copies only ``__name__``, ``__qualname__``, ``__doc__`` and
    ``__module__`` (strings) onto a function the program defined. The real one copies and updates any
    attribute the caller names (``updated=("__globals__",)`` copied a module's globals into the program's)."""
    if assigned is not _MISSING_ARG or updated is not _MISSING_ARG:
        raise SandboxViolation("functools.wraps(assigned=..., updated=...) is withheld in the sandbox: it copies "
                               "attributes named by the caller; use @functools.wraps(func)")  # fmt: skip

    def decorate(wrapper: Any) -> Any:
        if type(wrapper) is not types.FunctionType or wrapper.__code__.co_filename != TOOL_FILENAME:
            raise TypeError("functools.wraps in the sandbox decorates functions the program defines")
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            value = getattr(wrapped, attr, None)
            if type(value) is str:
                setattr(wrapper, attr, value)
        return wrapper

    return decorate


def _safe_canonicalize(xml_data: Any = None, *, out: Any = None, from_file: Any = None, **options: Any) -> Any:
    """``xml.etree.ElementTree.canonicalize`` without file opening: ``from_file`` must be an object with a
    ``read`` method (as ``io.StringIO`` is), never a path or a descriptor number, which the real one opens."""
    import xml.etree.ElementTree as ET

    if from_file is not None and (isinstance(from_file, _STRINGY) or not callable(getattr(from_file, "read", None))):
        raise SandboxViolation(
            "xml.etree.ElementTree.canonicalize(from_file=...) takes a file-like object with a read() method in "
            "the sandbox, never a path or descriptor; pass the text as xml_data"
        )
    return ET.canonicalize(xml_data, out=out, from_file=from_file, **options)


#: Public names replaced by a runner function of the same contract, minus the unsafe part.
MODULE_WRAPPERS: dict[str, dict[str, Any]] = {
    "functools": {"wraps": _safe_wraps},
    "xml.etree.ElementTree": {"canonicalize": _safe_canonicalize},
}

#: Special methods a program may never define, whatever else the compiler allows: the standard library calls
#: them implicitly and acts on their results by name (copy's reduce protocol sets attributes named by the
#: state it returns), or they run at moments the runner does not control (``__del__``, class creation hooks).
NEVER_DEFINED = frozenset({
    "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__", "__getnewargs_ex__",
    "__copy__", "__deepcopy__", "__getattribute__", "__del__", "__class_getitem__", "__init_subclass__",
    "__set_name__", "__mro_entries__", "__prepare__", "__instancecheck__", "__subclasscheck__",
    "__subclasshook__", "__fspath__",
})  # fmt: skip


_STRING_ANNOTATION = (
    "String annotations are not allowed: type-hint helpers evaluate them as code, outside the sandbox's "
    'compiler; write the annotation as an expression (x: Node, not x: "Node") or drop it'
)
#: Fields of a statement that hold statements (annotations and definitions live only in statements).
_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_BODIES: dict[type, tuple[str, ...]] = {}


def string_in_annotation(annotation: ast.expr | None) -> ast.AST | None:
    """The first string (or f-string) in an annotation that type-hint helpers would evaluate: not the values
    of ``Literal[...]`` nor the metadata of ``Annotated[type, ...]``, which they keep as data. Names,
    attributes, subscripts, unions and tuples (nearly every annotation) take the fast paths."""
    stack: list[ast.AST] = [] if annotation is None else [annotation]
    while stack:
        part = stack.pop()
        kind = type(part)
        if kind is ast.Name:
            continue
        if kind is ast.Constant:
            if isinstance(part.value, (str, bytes)):  # type: ignore[attr-defined]
                return part
            continue
        if kind is ast.JoinedStr:
            return part
        if kind is ast.Attribute:
            stack.append(part.value)  # type: ignore[attr-defined]
        elif kind is ast.Subscript:
            head, index = part.value, part.slice  # type: ignore[attr-defined]
            name = head.id if type(head) is ast.Name else head.attr if type(head) is ast.Attribute else ""
            stack.append(head)
            if name == "Literal":
                continue
            if name == "Annotated" and type(index) is ast.Tuple and index.elts:
                stack.append(index.elts[0])
                continue
            stack.append(index)
        elif kind is ast.BinOp:
            stack.extend((part.left, part.right))  # type: ignore[attr-defined]
        elif kind is ast.Tuple or kind is ast.List:
            stack.extend(part.elts)  # type: ignore[attr-defined]
        else:
            stack.extend(ast.iter_child_nodes(part))
    return None


def inner_wall_refusal(tree: ast.Module) -> tuple[str, int | None] | None:
    """Why the parsed program may not run (message, line), or None. Two refusals the compiler does not make:

    - a string anywhere in an annotation: annotations are never evaluated in the sandbox, but a string one is
      code that the standard library's type-hint helpers evaluate with ``eval()`` outside the restricted
      compiler (how ``functools.singledispatch`` reached ``os``); write the annotation as an expression;
    - a definition of a ``NEVER_DEFINED`` special method.

    Annotations and definitions only occur in statements, so only statements are walked (iteratively): a
    few percent of a program's nodes.
    """
    stack: list[Any] = list(tree.body)
    while stack:
        node = stack.pop()
        annotations: list[ast.expr | None] = []
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations.extend(a.annotation for a in every if a is not None)
            annotations.append(node.returns)
            name = node.name
        elif isinstance(node, ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
            if isinstance(node.target, ast.Name):
                name = node.target.id
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in NEVER_DEFINED:
                    name = target.id
        for annotation in annotations:
            part = string_in_annotation(annotation)
            if part is not None:
                return _STRING_ANNOTATION, getattr(part, "lineno", None)
        if name in NEVER_DEFINED:
            message = f"defining {name} is not allowed in the sandbox: the standard library calls it implicitly"
            return message, getattr(node, "lineno", None)
        fields = _BODIES.get(type(node))
        if fields is None:
            fields = _BODIES[type(node)] = tuple(f for f in _BODY_FIELDS if f in type(node)._fields)
        for field in fields:
            stack.extend(getattr(node, field))
    return None


#: Every sealed proxy's module name, by ``id`` of the proxy (kept off the proxy, where the program would see it).
_PROXY_MODULES: dict[int, str] = {}


class ModuleProxy(types.SimpleNamespace):
    """A namespace proxy once sealed: reading a withheld name is a ``SandboxViolation``; any other missing
    name an ``AttributeError``."""

    def __getattr__(self, attr: str) -> Any:
        module = _PROXY_MODULES.get(id(self), "module")
        if attr in withheld(module):
            raise withheld_name(module, attr)
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")


def _withheld_getattr(module: str) -> Any:
    """A module proxy's ``__getattr__`` (PEP 562: consulted only for names the proxy does not have)."""

    def __getattr__(attr: str) -> Any:
        if attr in withheld(module):
            raise withheld_name(module, attr)
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return __getattr__


def seal_proxy(proxy: Any, module: str) -> None:
    """Apply the inner wall to a freshly filled proxy of ``module``, whatever kind of object the proxy is:
    remove every withheld name, put ``MODULE_WRAPPERS``' replacements in place, and make reading a withheld
    name a ``SandboxViolation`` (a namespace proxy changes class; a module-object proxy gets a module-level
    ``__getattr__``, so reading present names keeps the interpreter's fast path)."""
    for name in withheld(module):
        if name in vars(proxy):
            delattr(proxy, name)
    for name, wrapper in MODULE_WRAPPERS.get(module, {}).items():
        if name in vars(proxy):
            setattr(proxy, name, wrapper)
    _PROXY_MODULES[id(proxy)] = module
    if isinstance(proxy, types.ModuleType):
        vars(proxy)["__getattr__"] = _withheld_getattr(module)
    elif isinstance(proxy, types.SimpleNamespace) and not isinstance(proxy, ModuleProxy):
        proxy.__class__ = ModuleProxy


def _real_module(value: types.ModuleType) -> bool:
    """An imported module (it has a spec, or is in ``sys.modules`` as itself), not a runner-made proxy."""
    return vars(value).get("__spec__") is not None or sys.modules.get(value.__name__) is value


class GlobalsSeal:
    """What the runner put into the program's globals, checked after the program returns and before each
    nested call is answered: the same objects under the runner's names, the same builtins dict with the
    same contents, and no real module object anywhere in the globals (programs only ever get proxies).
    A difference means the program rewrote its own namespace (``update_wrapper(..., updated=("__globals__",))``
    did, importing ``sys`` and the real builtins): ``sandbox_violation``."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.installed = dict(namespace)
        builtins = namespace.get("__builtins__")
        self.builtins = builtins
        self.builtin_items = dict(builtins) if isinstance(builtins, dict) else {}

    def add(self, name: str) -> None:
        """Seal one more runner-installed name (the program function, once defined)."""
        self.installed[name] = self.namespace.get(name)

    def check(self) -> None:
        namespace = self.namespace
        for name, value in self.installed.items():
            if namespace.get(name, _MISSING_ARG) is not value:
                raise SandboxViolation(f"the program's globals were rewritten: {name!r} is not the runner's")
        builtins = self.builtins
        if isinstance(builtins, dict) and (
            len(builtins) != len(self.builtin_items)
            or any(builtins.get(key, _MISSING_ARG) is not value for key, value in self.builtin_items.items())
        ):
            raise SandboxViolation("the program's builtins were rewritten")
        for name, value in namespace.items():
            if isinstance(value, types.ModuleType) and name not in self.installed and _real_module(value):
                raise SandboxViolation(f"the program's globals hold the real module {value.__name__!r} as {name!r}")


#: Modules the runner needs only until lock-down. Afterwards they are dropped from ``sys.modules`` and from
#: the runner's own globals, so an escaped program does not find them there (memory-mapping, foreign
#: calls, sockets, limits and signals). What still needs them later keeps only the values it uses.
FORGOTTEN_MODULES = ("ctypes", "_ctypes", "mmap", "resource", "socket", "_socket", "select", "fcntl", "signal")
#: Of those, the ones the runner's own code no longer uses once the program runs (the channel still uses
#: ``socket`` and may use ``select``): their names in this module's globals are cleared too.
_RUNNER_FORGETS = ("ctypes", "mmap", "resource", "fcntl", "signal")
#: What the result needs from ``resource`` after it is forgotten.
_GETRUSAGE, _RUSAGE_SELF = resource.getrusage, resource.RUSAGE_SELF
#: What the backstop timer needs from ``signal`` after it is forgotten.
_SETITIMER, _ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL


def forget_lockdown_modules() -> list[str]:
    """Drop ``FORGOTTEN_MODULES`` (and their sub-modules) from ``sys.modules``, and ``_RUNNER_FORGETS`` from
    this module's globals; return the names dropped from ``sys.modules``. Called once per execution, after
    lock-down and after the execute frame was read (mapping context values needs ``fcntl`` and ``mmap``),
    before the program runs. Never in the zygote, which locks down each child it forks."""
    dropped = []
    for name in list(sys.modules):
        if name.split(".")[0] in FORGOTTEN_MODULES:
            del sys.modules[name]
            dropped.append(name)
    here = globals()
    for name in _RUNNER_FORGETS:
        if isinstance(here.get(name), types.ModuleType):
            here[name] = None
    return sorted(dropped)


#: The seal of the running program's globals, checked before each nested call goes out and is answered.
ACTIVE_SEAL: list[GlobalsSeal] = []


def check_inner_wall() -> None:
    """Refuse to go on after a violation or with rewritten globals (nested calls ask this first)."""
    if VIOLATIONS:
        raise SandboxViolation(f"the program already violated the sandbox: {VIOLATIONS[0]}")
    for seal in ACTIVE_SEAL:
        seal.check()


class _ProgramStdout:
    """``sys.stdout`` while the program runs: standard-library code that prints (``calendar.prmonth``,
    ``re.DEBUG``) writes into the program's bounded capture, not onto the runner's own descriptors."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def write(self, text: str) -> int:
        return int(self.target.write(str(text)))

    def flush(self) -> None:
        return None


@contextlib.contextmanager
def program_streams(stdout: Any) -> Any:
    """Point ``sys.stdout`` at the program's capture and take ``sys.stdin`` (the runner's protocol channel
    on a container) away while the program runs."""
    saved = sys.stdout, sys.stdin
    sys.stdout, sys.stdin = _ProgramStdout(stdout), None
    try:
        yield
    finally:
        sys.stdout, sys.stdin = saved


# --- the program's world ------------------------------------------------------------------------------


def _populate(proxy: Any, name: str) -> None:
    """Import ``name`` and copy its public names (minus the withheld ones and sub-modules) onto ``proxy``."""
    __import__(name)
    withheld = ALLOWED_MODULES[name]
    for key, value in vars(sys.modules[name]).items():
        if not key.startswith("_") and key not in withheld and not isinstance(value, types.ModuleType):
            setattr(proxy, key, value)
    adjust = _PROXY_ADJUSTMENTS.get(name)
    if adjust is not None:
        adjust(proxy)
    seal_proxy(proxy, name)


#: Proxies whose module is still to be imported (lazy mode), by ``id`` of the proxy.
_PENDING: dict[int, str] = {}


class LazyModuleProxy(types.ModuleType):
    """A module proxy that imports its module the first time a missing attribute is read.

    Used where modules stay importable after lock-down (containers: the root file system is the image's),
    so a container imports only what its program uses: importing every allowed module costs about 20 ms
    of each container's start, a third of it. Once filled it becomes a plain module object again.
    """

    def __getattr__(self, attr: str) -> Any:
        name = _PENDING.pop(id(self), None)
        if name is None:
            raise AttributeError(f"module has no attribute {attr!r}")
        _populate(self, name)
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # reads specialise as module reads
        return getattr(self, attr)


def _new_proxy(name: str) -> Any:
    """An empty proxy: a plain module object (not a SimpleNamespace) because the interpreter reads a
    module's attributes fastest (``LOAD_ATTR_MODULE``): ``math.pi`` or ``json.dumps`` costs what it
    costs outside the sandbox. It is never in ``sys.modules``, and its dunder names stay unreachable."""
    return types.ModuleType(name)


def build_module_proxies(*, lazy: bool = False) -> dict[str, Any]:
    """A proxy per allowed module: filled now (``lazy=False``: nothing can be imported after a lock-down
    that changes the root), or on first use.

    Dotted modules hang under their parents' proxies, so ``import xml.etree.ElementTree as ET`` works.
    """
    proxies: dict[str, Any] = {}
    for name in sorted(ALLOWED_MODULES):
        if lazy:
            proxy: Any = LazyModuleProxy(name)
            _PENDING[id(proxy)] = name
        else:
            proxy = _new_proxy(name)
            _populate(proxy, name)
        proxies[name] = proxy
    for name in sorted(ALLOWED_MODULES, key=lambda n: n.count(".")):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            proxies.setdefault(parent, _new_proxy(parent))
        for depth in range(1, len(parts)):
            parent, child = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
            setattr(proxies[parent], parts[depth], proxies[child])
    return proxies


class BoundedText:
    """A print target that stops accepting text at its limit and remembers that it overflowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.overflowed = False

    def write(self, text: str) -> int:
        encoded = len(text.encode("utf-8", "replace"))
        if self.size + encoded > self.limit:
            room = max(self.limit - self.size, 0)
            self.parts.append(text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore"))
            self.size = self.limit
            self.overflowed = True
            raise OutputLimitExceeded(f"output exceeded {self.limit} bytes")
        self.parts.append(text)
        self.size += encoded
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


class ToolOutcome:
    """``Outcome.ok(value)`` / ``Outcome.error(type, message, retriable=...)`` returned by a program."""

    __slots__ = ("error_message", "error_type", "retriable", "status", "value")

    def __init__(self, status: str, value: Any, error_type: Any, error_message: Any, retriable: bool) -> None:
        self.status, self.value, self.retriable = status, value, bool(retriable)
        self.error_type = None if error_type is None else str(error_type)[:200]
        self.error_message = None if error_message is None else str(error_message)[:4096]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ToolOutcome:
        return cls(
            "ok" if data.get("status") == "ok" else "error",
            data.get("value"),
            data.get("error_type"),
            data.get("error_message"),
            bool(data.get("retriable")),
        )

    def __repr__(self) -> str:
        if self.ok:
            return f"Outcome.ok({self.value!r})"
        return f"Outcome.error({self.error_type!r}, {self.error_message!r})"


class OutcomeFactory:
    """What programs see as ``Outcome``."""

    @staticmethod
    def ok(value: Any = None) -> ToolOutcome:
        return ToolOutcome("ok", value, None, None, False)

    @staticmethod
    def error(error_type: str, message: str = "", retriable: bool = False) -> ToolOutcome:
        return ToolOutcome("error", None, error_type, message, retriable)


class Bridge:
    """Nested dynamic calls: a ``call`` frame out, a ``call_result`` frame back, synchronously."""

    def __init__(self, channel: int | Channel, out_fd: int, max_bytes: int) -> None:
        self.channel, self.out_fd, self.max_bytes = channel, out_fd, max_bytes
        self.next_id = 0
        self.next_declare_id = 0

    def call(self, target: dict[str, Any], method: str, args: list[Any], kwargs: dict[str, Any]) -> ToolOutcome:
        check_inner_wall()
        check_json(args, "nested call arguments")
        check_json(kwargs, "nested call arguments")
        call_id, self.next_id = self.next_id, self.next_id + 1
        frame = {"type": "call", "id": call_id, "target": target, "method": method, "args": args, "kwargs": kwargs}
        body = encode(frame)
        left = pause_backstop()  # the host does not charge nested calls to this one's deadline
        write_frame(self.out_fd, body)
        reply = read_frame(self.channel, self.max_bytes)
        resume_backstop(left)
        if isinstance(self.channel, Channel) and (self.channel.fds or self.channel.truncated):
            close_fds(self.channel.take_fds()[0])
            raise RuntimeError("host passed descriptors with a nested call's reply")
        if reply.get("type") != "call_result" or reply.get("id") != call_id:
            raise RuntimeError("host sent an unexpected reply to a nested call")
        outcome = reply.get("outcome")
        check_inner_wall()
        return ToolOutcome.from_wire(outcome if isinstance(outcome, dict) else {})

    def declare(self, target: dict[str, Any]) -> ToolOutcome:
        """Stage a ``delegate(...)`` contract with this attempt (a ``declare`` frame, answered like a call).
        Declarations are numbered on their own: nested calls keep their consecutive ids."""
        check_inner_wall()
        call_id, self.next_declare_id = self.next_declare_id, self.next_declare_id + 1
        write_frame(self.out_fd, {"type": "declare", "id": call_id, "target": target})
        reply = read_frame(self.channel, self.max_bytes)
        if isinstance(self.channel, Channel) and (self.channel.fds or self.channel.truncated):
            close_fds(self.channel.take_fds()[0])
            raise RuntimeError("host passed descriptors with a declaration's reply")
        if reply.get("type") != "call_result" or reply.get("id") != call_id:
            raise RuntimeError("host sent an unexpected reply to a declaration")
        outcome = reply.get("outcome")
        check_inner_wall()
        return ToolOutcome.from_wire(outcome if isinstance(outcome, dict) else {})


class InvalidContract(TypeError):
    """``delegate(...)`` got a contract the runtime cannot accept (not JSON, too long, refused by the host)."""


#: Longest purpose and JSON text of each other contract field (the wire model's bounds).
MAX_PURPOSE_CHARS = 1000
MAX_CONTRACT_FIELD_CHARS = 2000


def delegate_target(
    role: Any, purpose: Any = None, deliverable: Any = None, acceptance: Any = None, failure_policy: Any = None
) -> dict[str, Any]:
    """The wire target of ``delegate(...)``; InvalidContract for a field that is not JSON or too long."""
    if purpose is not None and not isinstance(purpose, str):
        raise InvalidContract(f"delegate(): purpose must be a string, not {type(purpose).__name__}")
    if purpose is not None and len(purpose) > MAX_PURPOSE_CHARS:
        raise InvalidContract(f"delegate(): purpose is longer than {MAX_PURPOSE_CHARS} characters")
    target = {"kind": "delegate", "name": str(role), "purpose": purpose}
    for name, value in (("deliverable", deliverable), ("acceptance", acceptance), ("failure_policy", failure_policy)):
        try:
            dump_json(value, f"delegate() {name}")
        except NotJson as exc:
            raise InvalidContract(
                f"{exc}; contract fields are JSON values (dict with str keys, list, str, int, float, bool, None)"
            ) from None
        if value is not None and len(json.dumps(value, ensure_ascii=False)) > MAX_CONTRACT_FIELD_CHARS:
            raise InvalidContract(f"delegate(): {name} is longer than {MAX_CONTRACT_FIELD_CHARS} characters of JSON")
        target[name] = value
    return target


def delegate(bridge: Bridge, role: Any, *contract: Any, **fields: Any) -> ToolHandle:
    """``delegate(role, purpose=..., ...)``: declare the contract (staged with the attempt), return a handle."""
    target = delegate_target(role, *contract, **fields)
    reply = bridge.declare(target)
    if not reply.ok:
        raise InvalidContract(f"delegate({target['name']!r}): {reply.error_message or reply.error_type}")
    return ToolHandle(bridge, target)


class ToolHandle:
    """What ``tool(name)`` and ``delegate(role, ...)`` return: every public method is a nested call."""

    __slots__ = ("_bridge", "_target")
    _bridge: Bridge
    _target: dict[str, Any]

    def __init__(self, bridge: Bridge, target: dict[str, Any]) -> None:
        object.__setattr__(self, "_bridge", bridge)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        bridge, target = self._bridge, self._target

        def invoke(*args: Any, **kwargs: Any) -> ToolOutcome:
            return bridge.call(target, method, list(args), kwargs)

        invoke.__name__ = method
        return invoke

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("tool handles are read-only; define behaviour in the tool, not on its handle")

    def __repr__(self) -> str:
        return f"<tool {self._target.get('name')!r}>"


class NotJson(TypeError):
    pass


#: A value (a result, a context value, a nested call's argument list) nests at most this many lists and
#: objects: the host parses frames up to 201 levels (``sandbox/protocol.py``) and a value sits one level
#: inside its frame. Deeper is the program's error (non_serializable_result), never a protocol violation.
MAX_VALUE_DEPTH = 200


def check_json(value: Any, what: str, _depth: int = 0) -> None:
    """Only what JSON round-trips exactly: dicts with str keys, lists, str, int, finite float, bool, None."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_VALUE_DEPTH and isinstance(item, (list, dict)):
            raise NotJson(f"{what} is nested more than {MAX_VALUE_DEPTH} levels deep")
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise NotJson(f"{what} contains a non-finite float")
            continue
        if isinstance(item, list | tuple):  # a tuple is sent as a list, as every JSON boundary does
            stack.extend((child, depth + 1) for child in item)
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise NotJson(f"{what} has a dict key of type {type(key).__name__}; JSON keys are strings")
                stack.append((child, depth + 1))
            continue
        raise NotJson(f"{what} contains a value of type {type(item).__name__}, which is not JSON")


#: A changed value whose text has more brackets than this may be nested deeper than the host accepts, so
#: it is walked (``check_json``) to report that precisely; anything with fewer brackets cannot be.
MAX_DEPTH_BRACKETS = 200


def dump_json(value: Any, what: str) -> bytes:
    """The canonical JSON text of ``value`` (as the host encodes it); NotJson unless it is exactly JSON.

    ``json.dumps`` in C refuses NaN/Infinity and non-JSON types. What it would silently convert (non-str
    dict keys, tuples) is caught by decoding the text again and comparing, also in C. Only on a failure,
    or when the value may be deeper than 200 levels, does the slow ``check_json`` walk run, to say exactly
    what is wrong, with the messages programs have always seen.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)
        body = text.encode()
        decoded = json.loads(text)
        exact = decoded == value or decoded == _tuples_as_lists(value)
    except (TypeError, ValueError, RecursionError) as exc:
        check_json(value, what)
        raise NotJson(f"{what} is not JSON: {exc}") from None
    if not exact or body.count(b"[") + body.count(b"{") > MAX_DEPTH_BRACKETS:
        check_json(value, what)
        if not exact:
            raise NotJson(f"{what} is not JSON (a non-string dict key)")
    return body


def _tuples_as_lists(value: Any) -> Any:
    """``value`` with every tuple (nested in lists, tuples and dicts) as a list: what its JSON text decodes
    to when nothing else was converted. Only called when the plain comparison fails."""
    if isinstance(value, list | tuple):
        return [_tuples_as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: _tuples_as_lists(item) for key, item in value.items()}
    return value


def _fast_dump(value: Any) -> bytes | None:
    """The canonical text if ``json.dumps`` accepts the value at all (None otherwise), without the checks."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)
        return text.encode()
    except (TypeError, ValueError, RecursionError):
        return None


class _Encoded:
    """A context key's JSON text, not yet decoded. Only the runner creates these; programs never see one."""

    __slots__ = ("body",)

    def __init__(self, body: ContextText) -> None:
        self.body = body


def _text(body: ContextText) -> bytes | bytearray:
    return body.read() if isinstance(body, MappedText) else body


class _ContextKeys(collections.abc.KeysView):  # type: ignore[type-arg]
    """``context.keys()``: a live view of the keys, like ``dict_keys``."""

    __slots__ = ()

    def __reversed__(self) -> Any:
        return reversed(self._mapping)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"dict_keys({list(self)!r})"


class LazyContext:
    """The program's ``context``: a mutable mapping that decodes a key's JSON text on first access.

    Not a dict subclass on purpose: C code (``dict(x)``, ``{**x}``, ``json.dumps``) reads a dict subclass's
    storage directly and would see the undecoded placeholders. Every path to a value goes through
    ``_value``; whole-mapping operations (values, items, copy, equality, repr) decode everything first and
    then use the real dict. ``isinstance(context, dict)`` still holds (``__class__``), as programs expect.

    At the end, ``delta`` reports what changed: a key never read is unchanged by construction; a key read
    is re-encoded and compared byte for byte with its original text; assigned or new keys are changed.
    """

    __slots__ = ("_items", "_original")
    #: RestrictedPython's write guard lets objects that say so handle their own writes (as dicts do).
    _guarded_writes = True

    def __init__(self, raw: dict[str, ContextText]) -> None:
        self._original = raw
        self._items: dict[Any, Any] = {key: _Encoded(body) for key, body in raw.items()}

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(context, dict) must hold for programs
        return dict

    # --- decoding ---

    def _value(self, key: Any) -> Any:
        value = self._items[key]
        if type(value) is _Encoded:
            value = self._items[key] = json.loads(_text(value.body))
        return value

    def _resolved(self) -> dict[Any, Any]:
        """The underlying dict with every key decoded (no placeholder left in it)."""
        for key, value in self._items.items():
            if type(value) is _Encoded:
                self._items[key] = json.loads(_text(value.body))
        return self._items

    # --- the mapping protocol ---

    def __getitem__(self, key: Any) -> Any:
        return self._value(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._items[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Any:
        return iter(self._items)

    def __reversed__(self) -> Any:
        return reversed(self._items)

    def keys(self) -> Any:
        return _ContextKeys(self)  # not the dict's view: its ``.mapping`` would show the placeholders

    def values(self) -> Any:
        return self._resolved().values()

    def items(self) -> Any:
        return self._resolved().items()

    def get(self, key: Any, default: Any = None) -> Any:
        return self._value(key) if key in self._items else default

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self._items:
            return self._value(key)
        self._items[key] = default
        return default

    _MISSING: Any = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if key in self._items:
            value = self._value(key)
            del self._items[key]
            return value
        if default is LazyContext._MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[Any, Any]:
        if not self._items:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(self._items))
        return key, self.pop(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._items.update(*args, **kwargs)

    def clear(self) -> None:
        self._items.clear()

    def copy(self) -> dict[Any, Any]:
        return dict(self._resolved())

    def __copy__(self) -> dict[Any, Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        import copy

        return copy.deepcopy(self._resolved(), memo)

    @staticmethod
    def fromkeys(keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)

    def __eq__(self, other: object) -> bool:
        return bool(self._resolved() == _plain(other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        return self._resolved() | _plain(other)

    def __ror__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        return other | self._resolved()

    def __ior__(self, other: Any) -> LazyContext:
        self._items.update(_plain(other))
        return self

    def __repr__(self) -> str:
        return repr(self._resolved())

    # --- the end of the execution ---

    def delta(self) -> tuple[list[tuple[str, bytes]], list[str]]:
        """The keys to send back (changed or new, with their texts) and the keys the program deleted."""
        changed: list[tuple[str, bytes]] = []
        for key, value in self._items.items():
            if type(value) is _Encoded:
                continue  # never read: the original text, unchanged by construction
            if not isinstance(key, str):
                raise NotJson(f"the new context has a dict key of type {type(key).__name__}; JSON keys are strings")
            original = self._original.get(key)
            text = _fast_dump(value)
            if original is not None and text is not None and len(original) == len(text) and _text(original) == text:
                continue  # read (perhaps mutated and restored), but the same JSON as before
            changed.append((key, dump_json(value, "the new context")))
        deleted = [key for key in self._original if key not in self._items]
        return changed, deleted


def _plain(value: Any) -> Any:
    """A LazyContext as its decoded dict (for C code that needs a real dict); anything else as it is."""
    return value._resolved() if type(value) is LazyContext else value


def _proxy_json(module: types.SimpleNamespace) -> None:
    """The ``json`` a program imports encodes its ``context`` (a LazyContext) like the dict it stands for."""

    class JSONEncoder(json.JSONEncoder):
        def default(self, o: Any) -> Any:
            if type(o) is LazyContext:
                return o._resolved()
            return super().default(o)

    def dumps(obj: Any, **kwargs: Any) -> str:
        user_default = kwargs.pop("default", None)
        if user_default is not None:
            kwargs["default"] = lambda o: o._resolved() if type(o) is LazyContext else user_default(o)
        kwargs.setdefault("cls", JSONEncoder)
        return json.dumps(obj, **kwargs)

    module.JSONEncoder = JSONEncoder
    module.dumps = dumps


_PROXY_ADJUSTMENTS: dict[str, Any] = {"json": _proxy_json}


_INTERNAL_IMPORT_DONE = types.SimpleNamespace()


def _guarded_import(proxies: dict[str, types.SimpleNamespace]) -> Any:
    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name in INTERNAL_IMPORTS and name in sys.modules:
            # The interpreter's own lazy import from C (PyImport_Import), which ignores what this returns and
            # takes the module from sys.modules: the program never gets the real module from here.
            return _INTERNAL_IMPORT_DONE
        if level != 0 or name not in proxies:
            raise ImportError(f"import of {name!r} is not allowed in the sandbox")
        if fromlist:
            return proxies[name]
        return proxies[name.split(".")[0]]

    return guarded_import


# --- the restricted language (issue 15): what programs may write, and the guards, at close to C speed ---
#
# RestrictedPython's default transformer turns every attribute read, item access, iteration and unpacking
# into a call of a guard. For us those guards check nothing the compiler cannot check once: attribute names
# are constants in the source, and item access, iteration and unpacking have no policy at all here. So the
# transformer below (``_policy_class``) keeps RestrictedPython's static checks and emits native operations
# for them; only what needs a decision at run time stays a call: attribute writes (``_write_``: whose
# object is it?), ``getattr``/``setattr``/``delattr``/``hasattr`` with computed names, and ``format``/
# ``format_map`` of strings (plain fields only). The OS boundary is the wall; this is defence in depth.


def _words(text: str) -> list[str]:
    return text.split()


#: The module name the program's code runs under: every class and function it defines carries it.
PROGRAM_MODULE = "sandforge_tool"

#: Special methods a program's own class may define (``def __eq__(self, other)`` in a class body).
#: Not here: what changes attribute lookup for everybody (``__getattribute__``), what runs at unpredictable
#: times (``__del__``), and hooks on class creation or pickling (``__init_subclass__``, ``__set_name__``,
#: ``__class_getitem__``, descriptors, ``__reduce__``...).
SPECIAL_METHODS: frozenset[str] = frozenset(
    f"__{name}__"
    for name in [
        *_words(
            "init post_init new repr str format bytes hash bool len length_hint iter next reversed contains "
            "getitem setitem delitem missing eq ne lt le gt ge call enter exit getattr setattr delattr "
            "neg pos abs invert round floor ceil trunc int float complex index copy deepcopy"
        ),
        *(
            f"{prefix}{op}"
            for op in _words("add sub mul truediv floordiv mod divmod pow matmul lshift rshift and or xor")
            for prefix in ("", "r", "i")
        ),
    ]
)
#: Special methods ``super().__x__(...)`` (or ``super(C, self).__x__``) may call: a program's own special
#: method extending its base's. Not the attribute protocol (``super().__setattr__`` writes any name).
SUPER_METHODS: frozenset[str] = SPECIAL_METHODS - {"__getattr__", "__setattr__", "__delattr__", "__new__"}
#: Attribute reads that stay a guard call: ``str.format`` and ``string.Formatter``'s field access.
GUARDED_READS: frozenset[str] = frozenset({"format", "format_map", "get_field", "get_value", "vformat"})
#: Names RestrictedPython's generated code uses (besides ``_x_`` names): never program-local.
RESERVED_NAMES: frozenset[str] = frozenset({"_print", "_print_", "printed"})

#: More modules that cannot reach the system (issue 15), each audited; merged into ALLOWED_MODULES.
#: Withheld: whatever evaluates strings (``typing.get_type_hints``, ``ForwardRef``), creates classes from a
#: namespace dict or a metaclass (``make_dataclass``, ``EnumType``, ``ABCMeta``), or writes attributes onto
#: any object it is given (``typing.final``, ``dataclass_transform``, ``enum.global_enum``...).
COMPAT_MODULES: dict[str, frozenset[str]] = {
    "abc": frozenset({"ABCMeta", "update_abstractmethods", "get_cache_token"}),
    "dataclasses": frozenset({"make_dataclass"}),
    "enum": frozenset(
        _words(
            "EnumMeta EnumType global_enum global_enum_repr global_str global_flag_repr show_flag_values "
            "pickle_by_enum_name pickle_by_global_name"
        )
    ),
    "typing": frozenset(
        _words(
            "get_type_hints ForwardRef dataclass_transform no_type_check no_type_check_decorator final "
            "reveal_type get_overloads clear_overloads TypeAliasType evaluate_forward_ref override"
        )
    ),
    "io": frozenset(),
}
#: Modules exposed by allow-list rather than by withholding: only these names.
EXPOSED_ONLY: dict[str, frozenset[str]] = {"io": frozenset({"StringIO", "BytesIO"})}
#: Modules the interpreter imports lazily from C on the program's behalf (``datetime.strptime`` imports
#: ``_strptime`` through the importing frame's ``__import__``): imported before lock-down, handed only to
#: that import, never importable by the program (import statements of ``_`` names are refused).
INTERNAL_IMPORTS: frozenset[str] = frozenset({"_strptime"})

#: Library objects whose public attributes are meant to be set, by (module, class name).
SETTABLE_ATTRIBUTES: dict[tuple[str, str], frozenset[str]] = {
    ("xml.etree.ElementTree", "Element"): frozenset({"text", "tail", "tag", "attrib"}),
    ("decimal", "Context"): frozenset({"prec", "rounding", "Emin", "Emax", "capitals", "clamp", "traps", "flags"}),
    ("textwrap", "TextWrapper"): frozenset(
        _words(
            "width initial_indent subsequent_indent expand_tabs replace_whitespace fix_sentence_endings "
            "break_long_words drop_whitespace break_on_hyphens tabsize max_lines placeholder"
        )
    ),
}
#: Mutable built-in containers: their instances (and library subclasses: defaultdict, Counter,
#: OrderedDict, deque) take writes as they are.
_WRITABLE_BASES: tuple[type, ...] = (dict, list, set, bytearray, collections.deque)
_WRITABLE_TYPES: frozenset[type] = frozenset(
    {dict, list, set, bytearray, collections.deque, collections.defaultdict, collections.OrderedDict,
     collections.Counter, LazyContext}
)  # fmt: skip
_FUNCTION = types.FunctionType


def _only(names: frozenset[str]) -> Any:
    def adjust(proxy: types.SimpleNamespace) -> None:
        for key in list(vars(proxy)):
            if key not in names and not key.startswith("_"):
                delattr(proxy, key)

    return adjust


class _ReadOnly:
    """What ``_write_`` returns for an object the program may not write: every write is a TypeError."""

    __slots__ = ("kind",)
    kind: str

    def __init__(self, ob: Any) -> None:
        object.__setattr__(self, "kind", type(ob).__name__)

    def _refuse(self, name: str, *_: Any) -> None:
        raise TypeError(
            f"cannot set or delete attribute {name!r} of a {self.kind} object in the sandbox: only the "
            "program's own objects (and a few library objects meant to be set) take attribute writes"
        )

    __setattr__ = _refuse
    __delattr__ = _refuse


class _Settable:
    """A library object's write proxy that passes on writes of the attributes meant to be set."""

    __slots__ = ("names", "ob")
    names: frozenset[str]
    ob: Any

    def __init__(self, ob: Any, names: frozenset[str]) -> None:
        object.__setattr__(self, "ob", ob)
        object.__setattr__(self, "names", names)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.names:
            _ReadOnly(self.ob)._refuse(name)
        setattr(self.ob, name, value)

    def __delattr__(self, name: str) -> None:
        _ReadOnly(self.ob)._refuse(name)


def write_guard(ob: Any) -> Any:
    """``_write_``: the object itself when the program may write its attributes, else a refusing proxy.

    Writable: instances of the program's own classes, those classes and functions themselves (their
    ``__module__`` is the program's; a program cannot set ``__module__``), and mutable built-in containers.
    Attribute names are checked by the compiler (no ``_`` names); item assignment is native.
    """
    kind = type(ob)
    if kind in _WRITABLE_TYPES or kind.__module__ == PROGRAM_MODULE:
        return ob
    if isinstance(ob, type) or kind is _FUNCTION:
        if getattr(ob, "__module__", None) == PROGRAM_MODULE:
            return ob
    elif kind is LazyContext or isinstance(ob, _WRITABLE_BASES):
        return ob
    names = SETTABLE_ATTRIBUTES.get((kind.__module__, kind.__qualname__))
    if names is not None:
        return _Settable(ob, names)
    return _ReadOnly(ob)


_INSPECT_ATTRIBUTES: frozenset[str] = frozenset()
_FORMATTER_PARSE: Any = None


def _check_attribute_name(name: Any) -> None:
    if type(name) is not str:
        raise TypeError("attribute name must be a string")
    if name[:1] == "_":
        raise AttributeError(f'"{name}" is an invalid attribute name because it starts with "_"')
    if name in _INSPECT_ATTRIBUTES or name.endswith("__roles__"):
        raise AttributeError(f'"{name}" is a restricted name, that is forbidden to access in RestrictedPython.')


def _plain_fields(template: str) -> None:
    """Refuse format fields that read attributes or items (``{0.__class__}``, ``{x[k]}``)."""
    for _literal, field, spec, _conversion in _FORMATTER_PARSE(template):
        if field is None:
            continue
        if field and not (field.isdigit() or field.isidentifier()):
            raise NotImplementedError(
                f"format field {{{field}}} reads an attribute or an item, which the sandbox does not allow "
                "in format strings; compute the value first and format it with a plain field"
            )
        if spec:
            _plain_fields(spec)


def _checked_format(text: str, method: str) -> Any:
    unbound = getattr(str, method)

    def format(*args: Any, **kwargs: Any) -> Any:
        _plain_fields(text)
        return unbound(text, *args, **kwargs)

    return format


def _checked_unbound_format(method: str) -> Any:
    unbound = getattr(str, method)

    def format(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            _plain_fields(text)
        return unbound(text, *args, **kwargs)

    return format


_STR_FORMATS: dict[Any, str] = {str.format: "format", str.format_map: "format_map"}


def _format_checked(value: Any) -> Any:
    """``value`` as read, unless it is ``str.format``/``format_map`` (bound to a string, however reached:
    ``s.format``, ``super(S, s).format``, ``str.format``): then the checked version of it."""
    method = getattr(value, "__name__", None)
    if method in ("format", "format_map"):
        owner = getattr(value, "__self__", None)
        if type(value) is types.BuiltinMethodType and isinstance(owner, str):
            return _checked_format(owner, method)
        if value in _STR_FORMATS:
            return _checked_unbound_format(_STR_FORMATS[value])
    return value


def guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """``getattr`` (and the compiler's ``_getattr_`` for ``format``-like names) with the static rules
    checked at run time, Python's semantics for a missing attribute (AttributeError unless a default is
    given), and ``str.format``/``format_map`` limited to plain fields."""
    if len(default) > 1:
        raise TypeError(f"getattr expected at most 3 arguments, got {2 + len(default)}")
    _check_attribute_name(name)
    if name in GUARDED_READS:
        if isinstance(obj, string.Formatter) or (isinstance(obj, type) and issubclass(obj, string.Formatter)):
            raise NotImplementedError("Using string.Formatter methods is not safe")
        return _format_checked(getattr(obj, name, *default))
    if default:
        return getattr(obj, name, default[0])
    return getattr(obj, name)


def guarded_setattr(obj: Any, name: str, value: Any) -> None:
    _check_attribute_name(name)
    setattr(write_guard(obj), name, value)


def guarded_delattr(obj: Any, name: str) -> None:
    _check_attribute_name(name)
    delattr(write_guard(obj), name)


def _safe_hasattr(obj: Any, name: str) -> bool:
    try:
        guarded_getattr(obj, name)
    except (AttributeError, NotImplementedError):
        return False
    return True


class _TypeMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, type)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        return issubclass(subclass, type)


class SandboxType(metaclass=_TypeMeta):
    """The program's ``type``: ``type(obj)`` for an object that is not a class, and ``isinstance(x, type)``.

    Not three-argument ``type(name, bases, namespace)``, and not ``type(cls)``: a metaclass would create
    classes from a namespace dict, around the class statement's checks (underscore names, special methods).
    """

    def __new__(cls, *args: Any) -> Any:
        if len(args) != 1:
            raise TypeError("the sandbox's type() takes exactly one argument; define classes with a class statement")
        kind = type(args[0])
        if kind is LazyContext:
            return dict
        if issubclass(kind, type):
            raise TypeError("type() of a class is not available in the sandbox")
        return kind


def compat_builtins() -> dict[str, Any]:
    """The builtins programs are written with, beyond RestrictedPython's safe set (issue 15)."""
    names = _words(
        "zip property classmethod staticmethod super object bytes bin ascii NotImplemented Ellipsis "
        "AssertionError NameError UnboundLocalError UnicodeDecodeError UnicodeEncodeError LookupError "
        "StopIteration ArithmeticError"
    )
    table = {name: getattr(py_builtins, name) for name in names}
    table.update(type=SandboxType, getattr=guarded_getattr, setattr=guarded_setattr, delattr=guarded_delattr,
                 hasattr=_safe_hasattr)  # fmt: skip
    return table


_BINDING_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _binds(function: ast.FunctionDef, name: str) -> bool:
    """Whether anything in ``function`` (nested scopes included, to be safe) could rebind or delete
    ``name``: an assignment, ``del``, a loop/with/except/import/match target, a nested definition or
    parameter of that name, or a ``global``/``nonlocal`` declaration of it."""
    for node in ast.walk(ast.Module(body=function.body, type_ignores=[])):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, _BINDING_NODES) and node.name == name:
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name).split(".")[0] == name:
            return True
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
            return True
        if isinstance(node, ast.MatchMapping) and node.rest == name:
            return True
    return False


class LowerForRestriction(ast.NodeTransformer):
    """The AST pass before RestrictedPython's: what it would refuse or guard slowly, said in plain Python.

    - ``x.a += v`` becomes ``t = x; u = t.a; u += v; t.a = u`` (each part evaluated once, in-place
      semantics kept; the write goes through ``_write_``). Names and items stay native augmented assignments.
    - Annotations are never evaluated: removed from function signatures and from assignments outside class
      bodies (``total: float = 0.0`` is ``total = 0.0``). In class bodies they stay (dataclasses, NamedTuple
      and TypedDict read them) and are checked like any expression, and string annotations are refused.
    - A ``def`` directly in a class body is marked as a method (special method names are allowed there).
    """

    def __init__(self) -> None:
        self.counter = 0
        self.in_class: list[bool] = [False]
        self.selfs: list[str | None] = [None]  # the current method's never-rebound first parameter

    def generic_visit(self, node: ast.AST) -> ast.AST:
        """Only statement lists are walked: everything this pass rewrites (definitions, annotated and
        augmented assignments) is a statement, and no expression contains a statement (a lambda has no
        annotations), so expressions are never descended into: the pass costs a visit per statement."""
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._statements(value))
        for handler in getattr(node, "handlers", None) or ():
            handler.body = self._statements(handler.body)
        for case in getattr(node, "cases", None) or ():
            case.body = self._statements(case.body)
        return node

    def _temp(self, value: ast.expr, node: ast.AST) -> tuple[ast.Assign, str]:
        self.counter += 1
        name = f"sandforge_aug_{self.counter}"
        assign = ast.copy_location(ast.Assign(targets=[ast.Name(name, ast.Store())], value=value), node)
        return ast.fix_missing_locations(assign), name

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        for child in node.body:
            if isinstance(child, ast.FunctionDef):
                child.sandforge_method = True  # type: ignore[attr-defined]
                first = (child.args.posonlyargs + child.args.args)[:1]
                if first and not _binds(child, first[0].arg):
                    child.sandforge_self = first[0].arg  # type: ignore[attr-defined]
        self.in_class.append(True)
        try:
            self.generic_visit(node)
        finally:
            self.in_class.pop()
        return node

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Any:
        self.selfs.append(getattr(node, "sandforge_self", None))
        try:
            return self._function_body(node)
        finally:
            self.selfs.pop()

    def _function_body(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Any:
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                arg.annotation = None
        if isinstance(node, ast.Lambda):
            return node  # an expression: no statements, no annotations
        node.returns = None
        self.in_class.append(False)
        try:
            node.body = self._statements(node.body)
        finally:
            self.in_class.pop()
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            result = self.visit(stmt)
            if result is None:
                continue
            out.extend(result if isinstance(result, list) else [result])
        return out or [ast.Pass()]

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        if self.in_class[-1] and isinstance(node.target, ast.Name):
            return node  # evaluated into the class's __annotations__; RestrictedPython checks it
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if not isinstance(target, ast.Attribute):
            return node
        prelude: list[ast.stmt] = []
        if isinstance(target.value, ast.Name) and target.value.id == self.selfs[-1]:
            obj = target.value.id  # a method's own never-rebound ``self``: evaluating it twice is the same
        else:
            bind_obj, obj = self._temp(target.value, node)
            prelude.append(bind_obj)
        bind_val, val = self._temp(ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Load()), node)
        update = ast.AugAssign(target=ast.Name(val, ast.Store()), op=node.op, value=node.value)
        store = ast.Assign(
            targets=[ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Store())],
            value=ast.Name(val, ast.Load()),
        )
        fixed = [ast.fix_missing_locations(ast.copy_location(stmt, node)) for stmt in (update, store)]
        return [*prelude, bind_val, *fixed]


#: The flag a method sets once per call when its first parameter is the program's own object.
OWN_FLAG = "_own_self_"


class _OwnWrites(ast.NodeTransformer):
    """In one method's body (not nested scopes), ``_write_(self)`` becomes
    ``(self if _own_self_ else _write_(self))``: a native store for the program's own objects, the guard
    for anything else (a method called on a foreign object: ``Class.method(library_object)``)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.changed = False

    def rewrite(self, function: ast.FunctionDef) -> bool:
        function.body = [self.visit(stmt) for stmt in function.body]
        return self.changed

    def visit_FunctionDef(self, node: ast.AST) -> Any:
        return node  # a nested scope: its ``self`` is a closure variable, guarded as usual

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "_write_" and len(node.args) == 1
                and isinstance(node.args[0], ast.Name) and node.args[0].id == self.owner):  # fmt: skip
            self.changed = True
            native = ast.IfExp(test=ast.Name(OWN_FLAG, ast.Load()), body=ast.Name(self.owner, ast.Load()), orelse=node)
            return ast.fix_missing_locations(ast.copy_location(native, node))
        return node


_POLICY: Any = None


def _policy_class() -> Any:
    """The RestrictedPython transformer sandforge compiles with (built once, after RestrictedPython is
    importable: in a container its path comes with the boot frame)."""
    global _POLICY, _INSPECT_ATTRIBUTES, _FORMATTER_PARSE
    if _POLICY is not None:
        return _POLICY
    from RestrictedPython import transformer as rp

    _INSPECT_ATTRIBUTES = frozenset(rp.INSPECT_ATTRIBUTES)
    _FORMATTER_PARSE = string.Formatter().parse

    def is_super_call(node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"

    class SandforgePolicy(rp.RestrictingNodeTransformer):
        """RestrictedPython's static rules, native operations where its guards would check nothing."""

        special_def: str | None = None

        def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
            if name and name[0] == "_" and name != "_" and name == self.special_def:
                return
            if (name and name[0] == "_" and len(name) > 1 and name[1] != "_" and name[-1] != "_"
                    and name not in RESERVED_NAMES and not (name[:4] == "_tmp" and name[4:].isdigit())):  # fmt: skip
                return  # a program-local helper name (``_parse``, ``_CACHE``): never one the runtime uses
            super().check_name(node, name, allow_magic_methods)

        def check_import_names(self, node: ast.Import | ast.ImportFrom) -> Any:
            # no program-local ``_`` names here: ``import _strptime`` and ``from _strptime import x`` stay refused
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in [*modules, *(n for alias in node.names for n in (alias.name, alias.asname) if n)]:
                if any(part.startswith("_") for part in name.split(".")):
                    self.error(node, f'"{name}" is an invalid variable name because it starts with "_"')
            return super().check_import_names(node)

        def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
            outer = self.special_def
            method = getattr(node, "sandforge_method", False) and node.name in SPECIAL_METHODS
            self.special_def = node.name if method else None
            try:
                self.check_name(node, node.name)
            finally:
                self.special_def = outer
            self.check_function_argument_names(node)
            with self.print_info.new_print_scope():
                node = self.node_contents_visit(node)
                self.inject_print_collector(node)
            owner = getattr(node, "sandforge_self", None)
            if owner is not None and _OwnWrites(owner).rewrite(node):
                # once per call: is ``self`` the program's own object? Then its writes are native stores.
                check = ast.parse(f"{OWN_FLAG} = _type_({owner}).__module__ == {PROGRAM_MODULE!r}").body[0]
                first = node.body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                node.body.insert(1 if docstring else 0, ast.fix_missing_locations(ast.copy_location(check, first)))
            return node

        def visit_Attribute(self, node: ast.Attribute) -> Any:
            attr = node.attr
            if attr.startswith("_") and not (attr in SUPER_METHODS and is_super_call(node.value)):
                self.error(node, f'"{attr}" is an invalid attribute name because it starts with "_".')
            if attr.endswith("__roles__"):
                self.error(node, f'"{attr}" is an invalid attribute name because it ends with "__roles__".')
            if attr in rp.INSPECT_ATTRIBUTES:
                self.error(node, f'"{attr}" is a restricted name, that is forbidden to access in RestrictedPython.')
            node = self.node_contents_visit(node)
            if isinstance(node.ctx, ast.Load):
                if attr not in GUARDED_READS:
                    return node  # the name is checked above: a native read is the guarded read
                call = ast.Call(func=ast.Name("_getattr_", ast.Load()), args=[node.value, ast.Constant(attr)],
                                keywords=[])  # fmt: skip
                return ast.fix_missing_locations(ast.copy_location(call, node))
            guard = ast.Call(func=ast.Name("_write_", ast.Load()), args=[node.value], keywords=[])
            node.value = ast.fix_missing_locations(ast.copy_location(guard, node.value))
            return node

        # Shortcuts: RestrictedPython visits every node's fields generically; these nodes need no check.
        def visit_Constant(self, node: ast.Constant) -> Any:
            return node

        def visit_Load(self, node: ast.AST) -> Any:
            return node

        visit_Store = visit_Del = visit_Load

        def visit_Name(self, node: ast.Name) -> Any:
            if node.id in ("print", "printed"):
                return super().visit_Name(node)  # the print collector's rewriting
            if isinstance(node.ctx, ast.Load):
                self.used_names[node.id] = True
            self.check_name(node, node.id)
            return node

        def _literal(self, node: Any) -> Any:
            if all(type(element) is ast.Constant for element in node.elts):
                return node  # a data literal: nothing to check in it
            return self.node_contents_visit(node)

        visit_List = visit_Tuple = visit_Set = _literal

        def visit_Subscript(self, node: ast.Subscript) -> Any:
            return self.node_contents_visit(node)  # item access has no policy here: native

        def guard_iter(self, node: Any) -> Any:
            return self.node_contents_visit(node)  # iteration and unpacking: native

        def visit_Assign(self, node: ast.Assign) -> Any:
            return self.node_contents_visit(node)

        def visit_With(self, node: ast.With) -> Any:
            return self.node_contents_visit(node)

        def visit_AugAssign(self, node: ast.AugAssign) -> Any:
            if isinstance(node.target, ast.Attribute):
                self.error(node, "Augmented assignment of attributes is not allowed.")  # lowered before
            return self.node_contents_visit(node)  # names and items: Python's own in-place operation

        def visit_Call(self, node: ast.Call) -> Any:
            if isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
                self.error(node, f"{node.func.id.capitalize()} calls are not allowed.")
            return self.node_contents_visit(node)

        def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
            for sub in ast.walk(node.annotation):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    self.error(node, "String annotations are not allowed: name the type itself.")
                    break
            return self.node_contents_visit(node)

        def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
            for name in node.names:
                self.check_name(node, name)
            return node

        # match statements: patterns compile to native reads; the names in them are checked statically
        def visit_Match(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def visit_match_case(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def _static_reference(self, node: ast.expr) -> None:
            """A pattern's class or value reference (``Color.RED``): a dotted name, read natively."""
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and (
                    sub.attr.startswith("_") or sub.attr in rp.INSPECT_ATTRIBUTES or sub.attr in GUARDED_READS
                ):
                    self.error(node, f'"{sub.attr}" is an invalid attribute name in a pattern.')
                elif isinstance(sub, ast.Name):
                    self.check_name(node, sub.id)

        def visit_MatchValue(self, node: Any) -> Any:
            self._static_reference(node.value)
            return node

        def visit_MatchSingleton(self, node: Any) -> Any:
            return node

        def visit_MatchSequence(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def visit_MatchMapping(self, node: Any) -> Any:
            self.check_name(node, node.rest)
            for key in node.keys:
                self._static_reference(key)
            node.patterns = [self.visit(p) for p in node.patterns]
            return node

        def visit_MatchClass(self, node: Any) -> Any:
            self._static_reference(node.cls)
            for attr in node.kwd_attrs:  # read natively: what the guards read through a call is refused
                if attr.startswith("_") or attr in GUARDED_READS or attr in rp.INSPECT_ATTRIBUTES:
                    self.error(node, f'"{attr}" is an invalid attribute name in a pattern.')
            node.patterns = [self.visit(p) for p in node.patterns]
            node.kwd_patterns = [self.visit(p) for p in node.kwd_patterns]
            return node

        def visit_MatchStar(self, node: Any) -> Any:
            self.check_name(node, node.name)
            return node

        def visit_MatchAs(self, node: Any) -> Any:
            self.check_name(node, node.name)
            return self.node_contents_visit(node)

        def visit_MatchOr(self, node: Any) -> Any:
            return self.node_contents_visit(node)

    _POLICY = SandforgePolicy
    return _POLICY


def _proxy_dataclasses(module: types.SimpleNamespace) -> None:
    """``dataclass`` on the program's own classes only: on a library class it would rewrite the library's
    methods in place (``@dataclass`` sets ``__init__``, ``__eq__``... on the class it is given)."""
    real = module.dataclass

    def dataclass(cls: Any = None, /, **options: Any) -> Any:
        def wrap(target: Any) -> Any:
            if not (isinstance(target, type) and getattr(target, "__module__", None) == PROGRAM_MODULE):
                raise TypeError("dataclass() applies to the program's own classes only")
            return real(**options)(target)

        return wrap if cls is None else wrap(cls)

    module.dataclass = dataclass


ALLOWED_MODULES.update(COMPAT_MODULES)
_PROXY_ADJUSTMENTS.update({name: _only(names) for name, names in EXPOSED_ONLY.items()})
_PROXY_ADJUSTMENTS["dataclasses"] = _proxy_dataclasses


_BASE_BUILTINS: dict[str, Any] = {}
_PRINTER: Any = None


def _base_builtins() -> dict[str, Any]:
    """The builtins every program gets, built once per process (a run copies the dict, ~2 us)."""
    if not _BASE_BUILTINS:
        from RestrictedPython.Guards import safe_builtins

        table = dict(safe_builtins)
        # Not RestrictedPython's limited_builtins: resource limits are the OS's job, and its range() caps at 1000.
        for extra in (
            "range", "tuple", "dict", "list", "set", "frozenset", "sum", "min", "max", "enumerate", "map",
            "filter", "reversed", "any", "all", "iter", "next", "sorted", "bytearray", "format",
            "ArithmeticError", "AttributeError", "Exception", "IndexError", "KeyError", "LookupError",
            "NotImplementedError", "RuntimeError", "StopIteration", "TypeError", "ValueError",
            "ZeroDivisionError", "OverflowError", "RecursionError", "UnicodeError",
        ):  # fmt: skip
            table[extra] = getattr(py_builtins, extra)
        table.update(compat_builtins())
        _BASE_BUILTINS.update(table)
    return _BASE_BUILTINS


def _printer_class() -> Any:
    global _PRINTER
    if _PRINTER is None:
        from RestrictedPython.PrintCollector import PrintCollector

        class Printer(PrintCollector):
            """RestrictedPython's print target, mirrored into the bounded stdout capture."""

            stdout: BoundedText

            def write(self, text: str) -> None:
                self.txt.append(text)
                self.stdout.write(text)

        _PRINTER = Printer
    return _PRINTER


def build_globals(proxies: dict[str, types.SimpleNamespace], stdout: BoundedText, bridge: Bridge) -> dict[str, Any]:
    _policy_class()  # the run-time guards' tables (INSPECT_ATTRIBUTES, the format parser) come with it
    printer = _printer_class()

    def make_printer(_getattr_: Any = None) -> Any:
        collector = printer(_getattr_)
        collector.stdout = stdout
        return collector

    builtins = dict(_base_builtins())
    builtins["__import__"] = _guarded_import(proxies)
    builtins["Outcome"] = OutcomeFactory
    builtins["tool"] = lambda name: ToolHandle(bridge, {"kind": "tool", "name": str(name)})
    builtins["delegate"] = lambda role, *contract, **fields: delegate(bridge, role, *contract, **fields)
    return {
        "__builtins__": builtins,
        "__name__": "sandforge_tool",
        "__metaclass__": type,
        "_getattr_": guarded_getattr,
        "_write_": write_guard,
        "_type_": type,
        "_print_": make_printer,
        "_apply_": lambda f, *a, **kw: f(*a, **kw),
    }


def _compile_restricted(tree: ast.Module) -> types.CodeType:
    """RestrictedPython's checks and rewrites (sandforge's policy), then ``compile`` without inheriting this
    module's ``from __future__ import annotations`` (class-body annotations must be objects, not strings,
    for dataclasses). SyntaxError with the policy's messages when it refuses the program."""
    errors: list[str] = []
    policy = _policy_class()(errors, [], {})
    policy.visit(tree)
    if errors:
        raise SyntaxError(tuple(errors))
    return compile(tree, TOOL_FILENAME, "exec", dont_inherit=True)


#: One refusal of the compiler: (``invalid_code`` or ``sandbox_violation``, line or None, message).
Refusal = tuple[str, int | None, str]


#: Host side: programs compiled here (by validation or the exchange), by text, as marshal bytes; the
#: execute frame carries them so the sandbox skips RestrictedPython's compilation (``host_compiled``).
_HOST_CODE: dict[str, bytes] = {}
_HOST_CODE_LOCK = threading.Lock()
HOST_CODE_CACHE = 256
#: What a shipped code object must have been compiled for: this interpreter's bytecode (magic number).
CODE_MAGIC = MAGIC_NUMBER.hex()


def host_compiled(code: str) -> dict[str, str] | None:
    """The execute frame's ``compiled`` field for ``code``: the code object ``compile_checked`` produces,
    compiled once per program text on the host (validation already did it for a validated program) and
    marshalled; None when the program does not compile (the runner then reports why, as always)."""
    with _HOST_CODE_LOCK:
        blob = _HOST_CODE.get(code)
    if blob is None:
        compile_checked(code, remember=True)
        with _HOST_CODE_LOCK:
            blob = _HOST_CODE.get(code)
        if blob is None:
            return None
    return {"magic": CODE_MAGIC, "marshal": base64.b64encode(blob).decode("ascii")}


def _remember(code: str, compiled: types.CodeType) -> None:
    blob = marshal.dumps(compiled)
    with _HOST_CODE_LOCK:
        _HOST_CODE.pop(code, None)
        _HOST_CODE[code] = blob
        while len(_HOST_CODE) > HOST_CODE_CACHE:
            del _HOST_CODE[next(iter(_HOST_CODE))]


def shipped_code(frame: dict[str, Any]) -> types.CodeType | None:
    """The code object the host compiled for this frame's program, if it was compiled for this
    interpreter's bytecode; None otherwise (the runner compiles the program itself). The host is the
    trusted side of the channel: only it writes frames to the runner."""
    shipped = frame.get("compiled")
    if (
        not isinstance(shipped, dict)
        or shipped.get("magic") != CODE_MAGIC
        or not isinstance(shipped.get("marshal"), str)
    ):
        return None
    try:  # host to sandbox only: the host never decodes anything but JSON from a sandbox
        compiled = marshal.loads(base64.b64decode(shipped["marshal"], validate=True))  # noqa: S302
    except (ValueError, TypeError, EOFError):
        return None
    if type(compiled) is not types.CodeType or compiled.co_filename != TOOL_FILENAME:
        return None
    return compiled


def compile_checked(
    code: str, tree: ast.Module | None = None, *, remember: bool = False
) -> tuple[types.CodeType | None, list[Refusal]]:
    """Compile the body as a function under sandforge's RestrictedPython policy: (code, []) or (None, every
    refusal). The host's validation calls this very function (``runtime.guardrails.engine``), so what the
    policy approves is what the sandbox compiles. ``tree``: the program already parsed (it is changed);
    ``remember``: keep the result for ``host_compiled`` (host side)."""
    compiled, refusals = _compile_checked(code, tree)
    if remember and compiled is not None:
        _remember(code, compiled)
    return compiled, refusals


def _compile_checked(code: str, tree: ast.Module | None) -> tuple[types.CodeType | None, list[Refusal]]:
    if tree is None:
        try:
            tree = ast.parse(code, TOOL_FILENAME, "exec")
        except (SyntaxError, ValueError) as exc:
            message = f"syntax error: {exc.msg if isinstance(exc, SyntaxError) else exc}"
            return None, [("invalid_code", getattr(exc, "lineno", None), message)]
        except (RecursionError, MemoryError):
            return None, [("invalid_code", None, "program is nested too deeply to compile")]
    refusal = inner_wall_refusal(tree)  # before lowering: it looks at annotations the lowering removes
    if refusal is not None:
        return None, [("sandbox_violation", refusal[1], refusal[0])]
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=n) for n in ("context", "args", "kwargs")], vararg=None,
        kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[],
    )  # fmt: skip
    at = {"lineno": 1, "col_offset": 0, "end_lineno": 1, "end_col_offset": 0}
    for arg in arguments.args:
        ast.copy_location(arg, ast.Pass(**at))
    body = tree.body or [ast.Pass(**at)]
    func = ast.FunctionDef(name=TOOL_FUNCTION, args=arguments, body=body, decorator_list=[], returns=None, **at)  # type: ignore[arg-type]
    try:
        # every node made from here on gets its location where it is made (no walk of the whole tree)
        wrapper = LowerForRestriction().visit(ast.Module(body=[func], type_ignores=[]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # RestrictedPython warns about constructs it then rejects
            return _compile_restricted(wrapper), []
    except SyntaxError as exc:
        if isinstance(exc.args[0], tuple):
            return None, [_refusal(str(m)) for m in exc.args[0]]
        kind = "invalid_code" if "outside function" in str(exc.msg) else "sandbox_violation"
        return None, [(kind, exc.lineno, str(exc.msg))]
    except (RecursionError, MemoryError):
        return None, [("invalid_code", None, "program is nested too deeply to compile")]


def _refusal(text: str) -> Refusal:
    """RestrictedPython's ``Line N: message`` as a refusal."""
    head, sep, rest = text.partition(": ")
    if sep and head.startswith("Line ") and head[5:].isdigit():
        return "sandbox_violation", int(head[5:]), rest
    return "sandbox_violation", None, text


def compile_program(code: str) -> tuple[types.CodeType | None, dict[str, Any] | None]:
    """Compile the body as a function under RestrictedPython; return (code, None) or (None, error)."""
    compiled, refusals = compile_checked(code)
    if not refusals:
        return compiled, None
    kind, line, message = refusals[0]
    if message.startswith("syntax error") or "nested too deeply" in message:
        return None, _error(kind, message, exception="SyntaxError" if line else None, line=line)
    text = "; ".join(f"Line {ln}: {msg}" if ln else msg for _, ln, msg in refusals)
    kind = "invalid_code" if "outside function" in text else "sandbox_violation"
    return None, _error(kind, f"rejected by the sandbox: {text}", exception="SyntaxError", line=line)


def _error(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    error = {"type": kind, "message": valid_text(message[:4000]), **{k: v for k, v in extra.items() if v is not None}}
    for name in ("exception", "tool_error_type"):  # the host accepts names of up to 200 characters
        if isinstance(error.get(name), str):
            error[name] = valid_text(error[name][:200])
    return error


def valid_text(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (which no frame can carry) becomes ``?``, the byte that
    ``BoundedText`` counted for it, instead of making the whole result unencodable."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()


def pause_backstop() -> float:
    """Stop the wall-clock backstop (while the host answers a nested call); returns the seconds left."""
    left, _ = _SETITIMER(_ITIMER_REAL, 0)
    return left


def resume_backstop(left: float) -> None:
    if left > 0:
        _SETITIMER(_ITIMER_REAL, left)


def _describe(exc: BaseException) -> str:
    """``str(exc)``, which runs the program's code (its ``__str__``, its arguments' ``__repr__``): whatever
    that raises or returns, the runner still writes its result."""
    try:
        return str(exc)
    except BaseException:
        return "(the exception's message could not be computed)"


def _tool_line(tb: types.TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TOOL_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _classify_exception(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "memory_limit"
    if isinstance(exc, OutputLimitExceeded):
        return "output_limit"
    if isinstance(exc, ImportError) and "not allowed in the sandbox" in str(exc):
        return "sandbox_violation"
    if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        return "sandbox_violation"
    if isinstance(exc, NotJson):
        return "non_serializable_result"
    if isinstance(exc, SandboxViolation):
        return "sandbox_violation"
    if isinstance(exc, InvalidContract):
        return "invalid_contract"
    return "execution"


class Result:
    """The one result: the header frame's fields, the return value's JSON text, the changed keys' texts."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {"type": "result", "status": "error"}
        self.value: bytes = b"null"
        self.changed: list[tuple[str, bytes]] = []

    def fail(self, error: dict[str, Any]) -> None:
        self.header.update(status="error", error=error, context_changed=[], context_deleted=[])
        self.value, self.changed = b"null", []


def execute(
    frame: dict[str, Any], raw_context: dict[str, ContextText], boot: dict[str, Any], bridge: Bridge,
    proxies: dict[str, Any],
) -> Result:  # fmt: skip
    limits = boot["limits"]
    stdout = BoundedText(int(limits["max_output_bytes"]))
    result = Result()
    compiled = shipped_code(frame)
    error = None
    if compiled is None:
        compiled, error = compile_program(str(frame.get("code", "")))
    args, kwargs = frame.get("args"), frame.get("kwargs")
    if error is None and not (isinstance(args, list) and isinstance(kwargs, dict)):
        error = _error("invalid_request", "args must be a list and kwargs an object")
    if error is None:
        assert compiled is not None
        namespace = build_globals(proxies, stdout, bridge)
        context = LazyContext(raw_context)
        try:
            exec(compiled, namespace)  # noqa: S102 - RestrictedPython-compiled, inside the sandbox
            ACTIVE_SEAL[:] = [GlobalsSeal(namespace)]
            with program_streams(stdout):
                value = namespace[TOOL_FUNCTION](context, args, kwargs)
            check_inner_wall()
            if isinstance(value, ToolOutcome):
                if not value.ok:
                    error = _error("tool_error", value.error_message or value.error_type or "tool error",
                                   tool_error_type=value.error_type, retriable=value.retriable)  # fmt: skip
                value = value.value
            if error is None:
                result.value = dump_json(value, "the return value")
                result.changed, deleted = context.delta()
                result.header.update(status="ok", context_deleted=deleted)
        except BaseException as exc:
            kind = _classify_exception(exc)
            name = type(exc).__name__
            message = _describe(exc) if kind != "memory_limit" else f"memory limit of {limits['memory_mb']} MB exceeded"
            error = _error(kind, f"{name}: {message}" if kind == "execution" else message,
                           exception=name, line=_tool_line(exc.__traceback__))  # fmt: skip
    if stdout.overflowed:
        error = _error("output_limit", f"the program printed more than {limits['max_output_bytes']} bytes")
    if VIOLATIONS:  # sticky: whatever the program did after it, caught or not
        error = _error("sandbox_violation", VIOLATIONS[0])
    if error is not None:
        result.fail(error)
    result.header["stdout"] = stdout.getvalue()
    result.header["stdout_truncated"] = stdout.overflowed
    usage = _GETRUSAGE(_RUSAGE_SELF)
    result.header["cpu_time_s"] = usage.ru_utime + usage.ru_stime
    result.header["peak_memory_mb"] = usage.ru_maxrss / 1024
    return result


def _encode_result(result: Result, max_bytes: int) -> list[bytes]:
    """The result's frames: the header (the value's text spliced in, not encoded twice), then one frame per
    changed key. A result that does not fit ``max_bytes`` in all becomes an output_limit error."""
    header = result.header
    header["context_changed"] = [[key, len(body)] for key, body in result.changed]
    header["stdout"] = valid_text(header.get("stdout", ""))
    try:
        rest = encode(header)
    except (TypeError, ValueError) as exc:  # a context key that is not valid text (a lone surrogate)
        result.fail(_error("non_serializable_result", f"the context cannot be sent back: {exc}"))
        header["context_changed"] = []
        try:
            rest = encode(header)
        except (TypeError, ValueError):
            return [encode({"type": "result", "status": "error", "error": _error("non_serializable_result", str(exc))})]
    body = b'{"value":' + result.value + b"," + rest[1:]
    total = len(body) + sum(HEADER.size + len(text) for _, text in result.changed)
    if total <= max_bytes:
        return [body, *(text for _, text in result.changed)]
    return [encode({
        "type": "result", "status": "error", "stdout": "", "stdout_truncated": bool(header.get("stdout")),
        "error": _error("output_limit", f"the result is {total} bytes; the limit is {max_bytes}"),
        "cpu_time_s": header.get("cpu_time_s", 0.0), "peak_memory_mb": header.get("peak_memory_mb", 0.0),
    })]  # fmt: skip


def write_frames(fd: int, bodies: list[bytes]) -> None:
    """Length-prefixed frames in as few writes as possible; a large body is written as it is, not copied."""
    pending = bytearray()
    for body in bodies:
        pending += HEADER.pack(len(body))
        if len(body) < 1 << 16:
            pending += body
            continue
        write_all(fd, bytes(pending))
        pending.clear()
        write_all(fd, body)
    if pending:
        write_all(fd, bytes(pending))


def prepare(boot: dict[str, Any]) -> dict[str, types.SimpleNamespace]:
    """Everything that must happen before lock-down: imports, module proxies, a warm compiler."""
    sys.path[:0] = [p for p in boot.get("sys_path", []) if isinstance(p, str)]
    import RestrictedPython  # noqa: F401 - import before lock-down: nothing is importable after it

    for name in INTERNAL_IMPORTS:
        __import__(name)

    # With a chroot (subprocess backend) nothing is importable after lock-down: import every allowed module
    # now. In a container the root stays the image, so modules are imported on first use.
    proxies = build_module_proxies(lazy=not boot.get("chroot", False))
    compile_program("return 1")  # warm RestrictedPython's lazily imported parts
    return proxies


def serve(in_fd: int, out_fd: int, boot: dict[str, Any], proxies: dict[str, types.SimpleNamespace]) -> int:
    """Lock down, report ready, run the one program, write the one result."""
    global _HOST_CHANNEL_FD
    max_bytes = int(boot["limits"]["max_message_bytes"])
    channel = Channel(in_fd)  # before lock-down; it lives until the process exits
    _HOST_CHANNEL_FD = in_fd
    protections, errors = lock_down(boot)
    handoff = handoff_ready(boot)
    write_frame(out_fd, {"type": "ready", "version": PROTOCOL_VERSION, "pid": os.getpid(),
                         "protections": protections, "errors": errors, "handoff": handoff is not None})  # fmt: skip
    try:
        frame, raw_context = read_execute(channel, max_bytes, handoff)
    except PassedTextError as exc:
        frame, raw_context = {"type": "invalid", "error": str(exc)}, {}
    except (EOFError, ValueError, json.JSONDecodeError):
        return 3
    forget_lockdown_modules()
    if frame.get("type") != "execute":
        result = Result()
        result.fail(_error("invalid_request", str(frame.get("error") or "expected an execute frame")))
    else:
        _SETITIMER(_ITIMER_REAL, float(boot["limits"]["timeout_s"]) + BACKSTOP_GRACE_S)
        result = execute(frame, raw_context, boot, Bridge(channel, out_fd, max_bytes), proxies)
        pause_backstop()
    write_frames(out_fd, _encode_result(result, max_bytes))
    return 0


# --- zygote: a pristine, pre-imported template that forks one fresh runner per execution ----------------

CHILD_RESULT_FD = 3


def _send(sock: Any, message: dict[str, Any]) -> None:
    sock.send(encode(message))


def _spawn_child(
    sock: Any, boot: dict[str, Any], proxies: dict[str, Any], request: dict[str, Any], fds: list[int]
) -> int:
    """Fork a runner whose stdin, stdout, stderr and result channel are the four descriptors received."""
    pid = os.fork()
    if pid:
        return pid
    status = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(CHILD_RESULT_FD + 1, 65536)
        child_boot = {**boot, "workdir": request.get("workdir")}
        status = serve(0, CHILD_RESULT_FD, child_boot, proxies)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(status)


def zygote(control_fd: int) -> int:
    """Serve spawn requests on a SEQPACKET control socket; report each child's exit and resource usage.

    The zygote never runs a program: it only forks. Each child performs the full lock-down itself, exactly
    like a freshly started runner, so a child is as fresh as a new process but costs a fork, not a start.
    """
    sock = socket.socket(fileno=control_fd)
    boot = json.loads(sock.recv(1 << 20))
    proxies = prepare(boot)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"op": "ready", "pid": os.getpid()})
    children: set[int] = set()
    try:
        return _zygote_loop(sock, boot, proxies, wake_r, children)
    finally:
        for child in children:  # the host hung up (it died or closed us): nothing may outlive it
            with contextlib.suppress(OSError):
                os.killpg(child, signal.SIGKILL)


def _zygote_loop(sock: Any, boot: dict[str, Any], proxies: dict[str, Any], wake_r: int, children: set[int]) -> int:
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            children.discard(pid)
            _send(sock, {"op": "exited", "pid": pid, "status": status, "cpu_time_s": usage.ru_utime + usage.ru_stime,
                         "maxrss_kb": usage.ru_maxrss})  # fmt: skip
        if sock.fileno() in readable:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
            if not message:
                return 0
            request = json.loads(message)
            try:
                if len(fds) != 4:
                    raise ValueError("a spawn request carries exactly four descriptors")
                pid = _spawn_child(sock, boot, proxies, request, fds)
                children.add(pid)
                _send(sock, {"op": "spawned", "id": request.get("id"), "pid": pid})
            except (OSError, ValueError) as exc:
                _send(sock, {"op": "failed", "id": request.get("id"), "error": str(exc)})
            finally:
                for fd in fds:
                    os.close(fd)


def _reexec_in_user_namespace(argv: list[str]) -> None:
    """Rootless start (``--userns``): enter a user namespace mapping our id to root, then exec this
    interpreter again inside it, before anything else runs.

    A process's memory belongs to the user namespace it exec'd in. Exec'd here, the runner (and every
    child a zygote forks) stays inspectable through ``/proc/<pid>/ns`` and ``root`` by the host, which owns
    this namespace, after the dumpable flag is cleared: the host verifies namespaces from outside, as it
    does as root. Each runner then enters a nested user namespace of its own in ``lock_down``. On failure
    the reason is kept for the ready report and the lock-down proceeds without (the host then refuses)."""
    libc = _libc()
    outer = (os.geteuid(), os.getegid())
    try:
        _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
        _map_ids((0, 0), outer)
    except OSError as exc:
        USERNS_ERRORS.append(f"user namespace: {exc}")
        return
    script = os.path.abspath(sys.argv[0])  # noqa: PTH100 - the runner avoids pathlib (import cost)
    args = [sys.executable, "-I", "-S", "-B", script, *(a for a in argv if a != "--userns")]
    os.execv(sys.executable, args)  # noqa: S606 - this interpreter again, same arguments


def main(argv: list[str]) -> int:
    if "--userns" in argv:
        _reexec_in_user_namespace(argv)
    if "--zygote" in argv:
        return zygote(int(argv[argv.index("--control-fd") + 1]))
    in_fd = int(argv[argv.index("--input-fd") + 1]) if "--input-fd" in argv else 0
    if "--result-stdout" in argv:
        out_fd = os.dup(1)
        os.dup2(2, 1)
    else:
        out_fd = int(argv[argv.index("--result-fd") + 1])
    boot = read_frame(in_fd, 1 << 20)
    if boot.get("type") != "boot":
        raise SystemExit("expected a boot frame")
    return serve(in_fd, out_fd, boot, prepare(boot))


def run(argv: list[str]) -> None:
    """The process entry point: `main`, then exit at once.

    Skip interpreter finalization: the result is written, nothing else may run, and tearing down dozens of
    modules would add milliseconds before the host sees the channel close. Containers import this module
    from its precompiled ``.pyc`` (see ``images/Dockerfile``) instead of running the file as a script,
    which would compile it again in every container.
    """
    status = main(argv)
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    run(sys.argv[1:])
