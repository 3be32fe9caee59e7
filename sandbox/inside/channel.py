"""The channel to the host: frames in (fd 0: a pipe, or a unix socket that may carry descriptors) and out.

Frames are a 4-byte big-endian length plus UTF-8 JSON (``wire``). The execute frame is followed by one
frame per context key; where fd 0 is a unix socket the largest texts are not moved at all: each is a sealed
memfd attached to the execute frame, checked and mapped read-only (``read_execute``, ``map_text``); in a
container run by dockerd, where fd 0 is a pipe, they are files in a read-only hand-off directory the host
confirmed at boot (``handoff_ready``).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import mmap
import os
import socket
import stat
import sys
from typing import Any

from .lazycontext import ContextText, MappedText, encode
from .wire import HANDOFF_PROOF_FILE, HEADER, MAX_PASSED_FDS, REQUIRED_SEALS


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
        self._collect(ancillary, flags)
        return got

    def recv_bytes(self, size: int) -> bytes:
        """Up to ``size`` bytes as one new ``bytes`` (a socket waits for all of them): read straight into the
        object the caller keeps, where ``readinto`` and a copy would move a large body twice."""
        if self.sock is None:
            return os.read(self.fd, size)
        data, ancillary, flags, _ = self.sock.recvmsg(size, socket.CMSG_SPACE(MAX_PASSED_FDS * 4), socket.MSG_WAITALL)
        self._collect(ancillary, flags)
        return data

    def _collect(self, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            self.truncated = True

    def take_fds(self) -> tuple[list[int], bool]:
        fds, truncated = self.fds, self.truncated
        self.fds, self.truncated = [], False
        return fds, truncated


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def read_exact(src: int | Channel, size: int) -> bytearray:
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
    (size,) = HEADER.unpack(read_exact(src, HEADER.size))
    if size > max_bytes:
        raise ValueError(f"frame of {size} bytes exceeds the limit")
    return read_exact(src, size)


def read_bytes_frame(src: int | Channel, max_bytes: int) -> bytes:
    """``read_raw_frame`` as ``bytes``, usually without the buffer and the copy (a fetch's body: 1 MiB is
    otherwise moved twice in the sandbox)."""
    (size,) = HEADER.unpack(read_exact(src, HEADER.size))
    if size > max_bytes:
        raise ValueError(f"frame of {size} bytes exceeds the limit")
    if not size:  # an empty input file: a socket's recvmsg of 0 bytes with MSG_WAITALL would wait for the next frame
        return b""
    first = src.recv_bytes(size) if isinstance(src, Channel) else os.read(src, size)
    if len(first) == size:
        return first
    if not first:
        raise EOFError("channel closed")
    return first + read_exact(src, size - len(first))


def read_frame(src: int | Channel, max_bytes: int) -> dict[str, Any]:
    frame = json.loads(read_raw_frame(src, max_bytes))
    if not isinstance(frame, dict):
        raise ValueError("frame is not an object")
    return frame


class PassedTextError(ValueError):
    """The host's descriptors do not match what the execute frame announces: an invalid request."""


def check_passed(fd: int, size: int, *, sealed: bool = True, what: str = "a passed value") -> None:
    """That ``fd`` is a regular file of exactly ``size`` bytes and, for a passed descriptor, a memfd sealed
    against writing, growing and shrinking; PassedTextError otherwise."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS) if sealed else REQUIRED_SEALS
        info = os.fstat(fd)
    except OSError as exc:
        raise PassedTextError(f"a passed descriptor is not a sealed memfd ({exc.strerror})") from None
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise PassedTextError("a passed descriptor is not sealed against writing and resizing")
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        raise PassedTextError(f"{what} holds {info.st_size} bytes, announced {size}")


def map_text(fd: int, size: int, *, sealed: bool = True) -> MappedText:
    """Check ``fd`` (``check_passed``) and map it read-only. The caller still owns (and closes) ``fd``."""
    check_passed(fd, size, sealed=sealed)
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
        with open(f"{where}/{HANDOFF_PROOF_FILE}", "rb") as fh:
            return where if fh.read(len(token) + 1) == token.encode() else None
    except OSError:
        return None


def open_handoff(where: str, index: int, size: int) -> MappedText:
    """Value ``index`` of a hand-off directory, mapped read-only (never through a symlink)."""
    fd = open_handed_off(where, index)
    try:
        return map_text(fd, size, sealed=False)
    finally:
        os.close(fd)


def open_handed_off(where: str, index: int) -> int:
    """A descriptor of file ``index`` of a hand-off directory, opened read-only without following a link."""
    try:
        return os.open(f"{where}/{index}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise PassedTextError(f"handed-off value {index} cannot be opened ({exc.strerror})") from None


def read_execute(
    src: int | Channel, max_bytes: int, handoff: str | None = None, passed: dict[int, int] | None = None
) -> tuple[dict[str, Any], dict[str, ContextText]]:
    """The execute frame and the context keys' texts that follow it, undecoded, within ``max_bytes`` in all.

    A key announced as ``[key, length, i]`` is descriptor ``i`` of those attached to the execute frame
    (a sealed memfd, mapped read-only) rather than a frame, or with a ``handoff`` directory its file ``i``;
    any other descriptor is closed and refused. With ``passed`` (a dict to fill), the descriptors the
    frame's ``files`` claim (``[name, length, i]``) are kept open there by index, for ``files.receive`` to
    check and take; without it a descriptor claimed so is refused like any unannounced one."""
    frame = read_frame(src, max_bytes)
    fds, truncated = src.take_fds() if isinstance(src, Channel) else ([], False)
    raw: dict[str, ContextText] = {}
    kept: set[int] = set()
    try:
        used = _context_texts(src, frame, fds, truncated, max_bytes, raw, handoff)
        if passed is not None and handoff is None:
            for index in _claimed_by_files(frame, len(fds)) - used:
                passed[index] = fds[index]
                kept.add(index)
        unannounced = len(fds) if handoff is not None else len(fds) - len(used) - len(kept)
        if unannounced:
            raise PassedTextError(f"{unannounced} passed descriptors are not announced")
        if isinstance(src, Channel) and src.fds:
            raise PassedTextError("descriptors came with a context frame, not with the execute frame")
        return frame, raw
    except BaseException:
        for text in raw.values():
            if isinstance(text, MappedText) and text.map is not None:
                text.map.close()
        if passed is not None:
            passed.clear()
        kept.clear()
        raise
    finally:
        close_fds([fd for i, fd in enumerate(fds) if i not in kept])  # mapped ones stay readable through their mapping
        if isinstance(src, Channel):
            close_fds(src.take_fds()[0])


def _claimed_by_files(frame: dict[str, Any], passed: int) -> set[int]:
    """The descriptor indices the input files' announcements name (checked in full by ``files.receive``)."""
    announced = frame.get("files", [])
    return {entry[2] for entry in announced if isinstance(entry, list) and len(entry) == 3
            and type(entry[2]) is int and 0 <= entry[2] < passed} if isinstance(announced, list) else set()  # fmt: skip


def _context_texts(
    src: int | Channel, frame: dict[str, Any], fds: list[int], truncated: bool, max_bytes: int,
    raw: dict[str, ContextText], handoff: str | None,
) -> set[int]:  # fmt: skip
    """Read the context texts into ``raw``; the descriptor indices they used."""
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
    return used


def write_frame(fd: int, frame: dict[str, Any] | bytes) -> None:
    body = frame if isinstance(frame, bytes) else encode(frame)
    write_all(fd, HEADER.pack(len(body)) + body)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FileBody:
    """A file's ``size`` bytes, left in the file: an input's sealed memfd (or hand-off file), an output file
    the collector checked. ``send_file`` moves them with ``os.sendfile`` (the kernel copies, or on tmpfs
    only references, the pages), never through this process's memory. The holder closes ``fd``."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def send_file(out_fd: int, body: FileBody) -> None:
    """Exactly ``body.size`` bytes of ``body`` (from its start) to ``out_fd``, a file or a pipe, through one
    1 MiB buffer; OSError if the file holds fewer (it shrank: the frame cannot be completed).

    Measured here (10 MB from a memfd onto the sandbox's huge-page tmpfs): ``os.sendfile`` and a mapping
    both take ~11 ms, reading into this reused buffer and writing from it ~4 ms (``docs/files.md``)."""
    buffer = copy_buffer()
    view = memoryview(buffer)
    sent = 0
    while sent < body.size:
        got = os.preadv(body.fd, [view[: min(body.size - sent, len(buffer))]], sent)
        if not got:
            raise OSError(errno.EIO, "a file ended before its announced length")
        write_all(out_fd, view[:got])
        sent += got


_BUFFER: list[bytearray] = []


def copy_buffer() -> bytearray:
    """The runner's one copy buffer (1 MiB), made on first use and reused: its pages are touched once."""
    if not _BUFFER:
        _BUFFER.append(bytearray(1 << 20))
    return _BUFFER[0]


def passes_fds(fd: int) -> bool:
    """``fd`` (the result channel) is a unix socket, which carries descriptors: the host's, made to take the
    output files' (``sandbox/channel.py``, ``result_channel``). A pipe or Docker's stream carries none."""
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


def disk_in_memory() -> bool:
    """The working directory's files are in memory (tmpfs): ``F_GET_SEALS`` answers for those alone, asked
    of a nameless file made there and closed at once. The host reads a passed output file only if so
    (``sandbox/files.py``), since such a read never waits. Asked before ``fcntl`` is forgotten."""
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def result_socket(fd: int) -> socket.socket | None:
    """The result channel ``fd`` as a socket object that can attach descriptors, when it is a unix socket
    and the disk is in memory (``passes_fds``, ``disk_in_memory``); None otherwise. Made before the
    tripwire is armed (making a socket object is an event that trips); it shares ``fd``'s file."""
    return socket.socket(fileno=os.dup(fd)) if passes_fds(fd) and disk_in_memory() else None


def send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """``data`` with ``fds`` attached to its first byte (SCM_RIGHTS); the tripwire lets this function's
    ``sendmsg`` through, and no other code's."""
    packed = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)  # not array.array: making one is audited
    sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, packed)])
    write_all(sock.fileno(), data[sent:])


def write_frames(
    fd: int, bodies: list[bytes | FileBody], fds: list[int] | None = None, sock: socket.socket | None = None
) -> None:
    """Length-prefixed frames in as few writes as possible; a large body is written as it is, not copied,
    and a file's body is sent from the file (``send_file``). ``fds`` ride on the first frame's first byte
    (``sock``: ``fd`` as a socket, ``result_socket``)."""
    pending = bytearray()
    if fds and sock is not None:
        first = bodies[0]
        assert isinstance(first, bytes)
        send_with_fds(sock, HEADER.pack(len(first)) + first, fds)
        bodies = bodies[1:]
    for body in bodies:
        pending += HEADER.pack(len(body))
        if isinstance(body, FileBody):
            write_all(fd, bytes(pending))
            pending.clear()
            send_file(fd, body)
            continue
        if len(body) < 1 << 16:
            pending += body
            continue
        write_all(fd, bytes(pending))
        pending.clear()
        write_all(fd, body)
    if pending:
        write_all(fd, bytes(pending))
