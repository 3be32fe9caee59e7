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
import mmap
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import types
import warnings
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


def _enter_namespaces(libc: ctypes.CDLL) -> list[str]:
    """New network, mount, ipc, uts and pid namespaces; a user namespace too when not root."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    names = ["net_namespace", "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace"]
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        flags |= CLONE_NEWUSER
        names.append("user_namespace")
    _check(libc.unshare(flags), "unshare")
    if uid != 0:
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"0 {uid} 1")
        _write_file("/proc/self/gid_map", f"0 {gid} 1")
    return names


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
    """Apply every protection the boot frame asks for; report what is active and what failed."""
    libc = _libc()
    active: dict[str, bool] = {}
    errors: list[str] = []
    limits = boot["limits"]
    uid, gid = boot.get("drop_to_uid"), boot.get("drop_to_gid")
    owner = (uid if uid is not None else 0, gid if gid is not None else 0)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    pid_ns = False
    if boot.get("namespaces"):
        death_signal = _parent_death_signal(libc)
        try:
            for name in _enter_namespaces(libc):
                active[name] = True
            pid_ns = True
        except OSError as exc:
            errors.append(f"namespaces: {exc}")
        _rearm_parent_death(libc, death_signal)  # a new user namespace clears it
    workdir = boot.get("workdir")
    if boot.get("chroot") and workdir:
        try:
            _private_root(libc, workdir, int(limits["disk_mb"]), owner)
            active["private_root"] = True
        except OSError as exc:
            errors.append(f"private root: {exc}")
    elif workdir:
        os.chdir(workdir)
    if pid_ns:
        _become_pid1(libc)
    if uid is not None and gid is not None and os.geteuid() == 0:
        death_signal = _parent_death_signal(libc)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            active["unprivileged_user"] = True
        except OSError as exc:
            errors.append(f"drop privileges: {exc}")
        _rearm_parent_death(libc, death_signal)  # setuid/setgid clear it
    elif os.geteuid() != 0:
        active["unprivileged_user"] = True
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


def _populate(proxy: types.SimpleNamespace, name: str) -> None:
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


class LazyModuleProxy(types.SimpleNamespace):
    """A module proxy that imports its module the first time a missing attribute is read.

    Used where modules stay importable after lock-down (containers: the root file system is the image's),
    so a container imports only what its program uses: importing every allowed module costs about 20 ms
    of each container's start, a third of it.
    """

    def __getattr__(self, attr: str) -> Any:
        name = _PENDING.pop(id(self), None)
        if name is None:
            raise AttributeError(f"module has no attribute {attr!r}")
        _populate(self, name)
        return getattr(self, attr)


def build_module_proxies(*, lazy: bool = False) -> dict[str, types.SimpleNamespace]:
    """A proxy per allowed module: filled now (``lazy=False``: nothing can be imported after a lock-down
    that changes the root), or on first use.

    Dotted modules hang under their parents' proxies, so ``import xml.etree.ElementTree as ET`` works.
    """
    proxies: dict[str, types.SimpleNamespace] = {}
    for name in sorted(ALLOWED_MODULES):
        if lazy:
            proxy: types.SimpleNamespace = LazyModuleProxy()
            _PENDING[id(proxy)] = name
        else:
            proxy = types.ModuleType(name)  # type: ignore[assignment]  # never in sys.modules; fast reads
            _populate(proxy, name)
        proxies[name] = proxy
    for name in sorted(ALLOWED_MODULES, key=lambda n: n.count(".")):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            proxies.setdefault(parent, types.SimpleNamespace())
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
        if isinstance(item, list):
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
        exact = json.loads(text) == value
    except (TypeError, ValueError, RecursionError) as exc:
        check_json(value, what)
        raise NotJson(f"{what} is not JSON: {exc}") from None
    if not exact or body.count(b"[") + body.count(b"{") > MAX_DEPTH_BRACKETS:
        check_json(value, what)
        if not exact:
            raise NotJson(f"{what} is not JSON (a non-string dict key or a tuple)")
    return body


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


def _guarded_import(proxies: dict[str, types.SimpleNamespace]) -> Any:
    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level != 0 or name not in proxies:
            raise ImportError(f"import of {name!r} is not allowed in the sandbox")
        if fromlist:
            return proxies[name]
        return proxies[name.split(".")[0]]

    return guarded_import


def _inplacevar(op: str, x: Any, y: Any) -> Any:
    import operator

    ops = {
        "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
        "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "<<=": operator.ilshift,
        ">>=": operator.irshift, "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
        "@=": operator.imatmul,
    }  # fmt: skip
    if op not in ops:
        raise SyntaxError(f"unsupported in-place operator {op}")
    apply: Any = ops[op]
    return apply(x, y)


def build_globals(proxies: dict[str, types.SimpleNamespace], stdout: BoundedText, bridge: Bridge) -> dict[str, Any]:
    from RestrictedPython import Guards
    from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
    from RestrictedPython.Guards import safe_builtins
    from RestrictedPython.PrintCollector import PrintCollector

    class Printer(PrintCollector):
        """RestrictedPython's print target, mirrored into the bounded stdout capture."""

        def write(self, text: str) -> None:
            self.txt.append(text)
            stdout.write(text)

    builtins = dict(safe_builtins)
    # Not RestrictedPython's limited_builtins: resource limits are the OS's job, and its range() caps at 1000.
    for extra in (
        "range", "tuple", "dict", "list", "set", "frozenset", "sum", "min", "max", "enumerate", "map", "filter",
        "reversed", "any", "all", "iter", "next", "sorted", "bytearray", "format",
        "ArithmeticError", "AttributeError", "Exception", "IndexError", "KeyError", "LookupError",
        "NotImplementedError", "RuntimeError", "StopIteration", "TypeError", "ValueError",
        "ZeroDivisionError", "OverflowError", "RecursionError", "UnicodeError",
    ):  # fmt: skip
        builtins[extra] = getattr(py_builtins, extra)
    builtins["getattr"] = guarded_getattr
    builtins["hasattr"] = lambda obj, name: _safe_hasattr(guarded_getattr, obj, name)
    builtins["__import__"] = _guarded_import(proxies)
    builtins["Outcome"] = OutcomeFactory
    builtins["tool"] = lambda name: ToolHandle(bridge, {"kind": "tool", "name": str(name)})
    builtins["delegate"] = lambda role, purpose=None, deliverable=None, acceptance=None, failure_policy=None: (
        ToolHandle(
            bridge,
            {
                "kind": "delegate", "name": str(role), "purpose": purpose, "deliverable": deliverable,
                "acceptance": acceptance, "failure_policy": failure_policy,
            },
        )
    )  # fmt: skip
    return {
        "__builtins__": builtins,
        "__name__": "sandforge_tool",
        "__metaclass__": type,
        "_getattr_": guarded_getattr,
        "_getitem_": default_guarded_getitem,
        "_getiter_": default_guarded_getiter,
        "_iter_unpack_sequence_": Guards.guarded_iter_unpack_sequence,
        "_unpack_sequence_": Guards.guarded_unpack_sequence,
        "_write_": Guards.full_write_guard,
        "_inplacevar_": _inplacevar,
        "_print_": Printer,
        "_apply_": lambda f, *a, **kw: f(*a, **kw),
    }


_MISSING = object()


def guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """RestrictedPython's ``safer_getattr`` with Python's semantics for a missing attribute.

    ``safer_getattr`` falls back to a default of ``None``, so ``x.missing`` and ``getattr(x, "missing")``
    would quietly be ``None`` and ``hasattr`` always true; a tool would compute with ``None`` instead of
    failing. Here a missing attribute raises ``AttributeError`` unless a default is given.
    """
    from RestrictedPython import Guards

    if len(default) > 1:
        raise TypeError(f"getattr expected at most 3 arguments, got {2 + len(default)}")
    value = Guards.safer_getattr(obj, name, _MISSING)  # type: ignore[no-untyped-call]
    if value is _MISSING:
        if default:
            return default[0]
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    return value


def _safe_hasattr(getter: Any, obj: Any, name: str) -> bool:
    try:
        getter(obj, name)
    except (AttributeError, NotImplementedError):
        return False
    return True


class LowerAugmentedAssignment(ast.NodeTransformer):
    """Rewrite ``x[k] += v`` / ``x.a += v`` as plain assignments, which RestrictedPython can guard.

    Each sub-expression is bound to a temporary first, so it is evaluated exactly once, as in Python.
    """

    def __init__(self) -> None:
        self.counter = 0

    def _temp(self, value: ast.expr, node: ast.AST) -> tuple[ast.Assign, ast.Name]:
        self.counter += 1
        name = f"sandforge_aug_{self.counter}"
        assign = ast.copy_location(ast.Assign(targets=[ast.Name(name, ast.Store())], value=value), node)
        return assign, ast.Name(name, ast.Load())

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        self.generic_visit(node)
        target = node.target
        if isinstance(target, ast.Subscript) and not isinstance(target.slice, ast.Slice):
            bind_obj, obj = self._temp(target.value, node)
            bind_key, key = self._temp(target.slice, node)
            load: ast.expr = ast.Subscript(obj, key, ast.Load())
            store: ast.expr = ast.Subscript(ast.Name(obj.id, ast.Load()), ast.Name(key.id, ast.Load()), ast.Store())
            prelude = [bind_obj, bind_key]
        elif isinstance(target, ast.Attribute):
            bind_obj, obj = self._temp(target.value, node)
            load = ast.Attribute(obj, target.attr, ast.Load())
            store = ast.Attribute(ast.Name(obj.id, ast.Load()), target.attr, ast.Store())
            prelude = [bind_obj]
        else:
            return node
        assign = ast.Assign(targets=[store], value=ast.BinOp(load, node.op, node.value))
        return [*prelude, ast.copy_location(assign, node)]


def compile_program(code: str) -> tuple[types.CodeType | None, dict[str, Any] | None]:
    """Compile the body as a function under RestrictedPython; return (code, None) or (None, error)."""
    from RestrictedPython.compile import compile_restricted

    try:
        module = ast.parse(code, TOOL_FILENAME, "exec")
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        return None, _error("invalid_code", f"syntax error: {exc.msg if isinstance(exc, SyntaxError) else exc}",
                            exception=type(exc).__name__, line=line)  # fmt: skip
    except (RecursionError, MemoryError):
        return None, _error("invalid_code", "program is nested too deeply to compile")
    refusal = inner_wall_refusal(module)
    if refusal is not None:
        return None, _error("sandbox_violation", f"rejected by the sandbox: {refusal[0]}", line=refusal[1])
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=n) for n in ("context", "args", "kwargs")], vararg=None,
        kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[],
    )  # fmt: skip
    body = module.body or [ast.Pass()]
    func = ast.FunctionDef(name=TOOL_FUNCTION, args=arguments, body=body, decorator_list=[], returns=None)
    wrapper = LowerAugmentedAssignment().visit(ast.Module(body=[func], type_ignores=[]))
    ast.fix_missing_locations(wrapper)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # RestrictedPython warns about constructs it then rejects
            compiled = compile_restricted(wrapper, TOOL_FILENAME, "exec")
    except SyntaxError as exc:
        message = "; ".join(str(m) for m in exc.args[0]) if isinstance(exc.args[0], tuple) else str(exc)
        kind = "invalid_code" if "outside function" in message else "sandbox_violation"
        return None, _error(kind, f"rejected by the sandbox: {message}", exception="SyntaxError",
                            line=getattr(exc, "lineno", None))  # fmt: skip
    except (RecursionError, MemoryError):
        return None, _error("invalid_code", "program is nested too deeply to compile")
    return compiled, None


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
            message = str(exc) if kind != "memory_limit" else f"memory limit of {limits['memory_mb']} MB exceeded"
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


def main(argv: list[str]) -> int:
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
