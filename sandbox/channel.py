"""How bytes reach a worker and come back: the I/O type every backend provides, and the pipe and socket
channels the subprocess, runc and runsc backends share (Docker's attach socket is the docker backend's own).

``sandbox/exchange.py`` speaks the protocol over any ``WorkerIO``; what a channel can do beyond sending and
polling is stated on the type, not probed: ``passes_fds`` (large context values travel as sealed memfds),
``handoff`` (they are written to a hand-off directory the worker confirmed), ``streams_inputs`` (large input
files go as frames the runner writes to its disk), ``take_fds()`` (descriptors that came on the result channel:
large output files) and ``unread()``.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import os
import select
import selectors
import socket
import struct
import termios
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from sandforge.sandbox.handoff import HandoffDir

Stream = Literal["result", "stdout", "stderr"]

#: A send with no execution deadline (the boot frame) is still bounded by this.
DEFAULT_SEND_TIMEOUT_S = 30.0


def send_deadline(deadline: float | None) -> float:
    """The monotonic time a send must be done by: the caller's deadline or ``DEFAULT_SEND_TIMEOUT_S`` from now."""
    return time.monotonic() + DEFAULT_SEND_TIMEOUT_S if deadline is None else deadline


class WorkerIO(abc.ABC):
    """How bytes reach a worker, and what the channel can do besides.

    Every send is bounded: it raises ``TimeoutError`` when ``deadline`` (``time.monotonic()``; None means
    ``DEFAULT_SEND_TIMEOUT_S`` from now) passes with bytes still unsent, so a worker that stops reading
    cannot hold the host."""

    #: The channel can attach descriptors to what it sends (a unix socket): ``send_fds`` works.
    passes_fds: ClassVar[bool] = False
    #: A hand-off directory the worker confirmed (``sandbox/handoff.py``): large values are written there.
    handoff: HandoffDir | None = None
    #: Large input files go as frames the runner writes onto its disk as they come, not as memfds or hand-off
    #: files: where that disk takes huge pages (the subprocess backend's tmpfs) this is the cheaper way in, since
    #: filling a memfd costs a small page per 4 KiB (``docs/files.md``, "How the bytes cross").
    streams_inputs: bool = False
    #: How many bytes the result channel carried after the ready frame, in the reads that brought it: the runner
    #: writes nothing between its ready report and the program's frame, so the exchange refuses any.
    early_bytes: int = 0

    @abc.abstractmethod
    def send(self, data: bytes, deadline: float | None = None) -> None: ...

    @abc.abstractmethod
    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        """Chunks that arrived within ``timeout`` seconds; an empty chunk means that stream ended."""

    def send_fds(self, data: bytes, fds: list[int], deadline: float | None = None) -> None:
        """``data`` with ``fds`` attached (SCM_RIGHTS); only where ``passes_fds``."""
        raise TypeError(f"{type(self).__name__} cannot pass descriptors")

    def unread(self) -> int:
        """Bytes sent that the worker has not read yet; 0 where the channel cannot tell."""
        return 0

    def take_fds(self) -> tuple[list[int], bool]:
        """The descriptors that came attached to the result channel's bytes since the last call (the caller
        owns them now), and whether the kernel dropped some (more than ``MAX_PASSED_FDS`` at once). None
        here: only a result channel that is a unix socket carries any (``SocketIO`` with ``result_sock``)."""
        return [], False

    def send_piped(self, head: bytes, body: PipedBody, deadline: float | None = None) -> None:
        """``head`` then all of ``body``'s bytes, by ``deadline``; ``body`` is closed either way. Here the
        body is read into this process and sent (Docker's attach socket); pipe and socket channels splice it
        from its pipe into theirs, never through this process's memory (``PipeIO.send_piped``)."""
        try:
            self.send(head + body.read(), deadline)
        finally:
            body.close()


#: What ``os.splice`` is asked to do: move pages rather than copy them, and never block (the caller waits
#: in select, bounded by its deadline).
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


class PipedBody:
    """A body of exactly ``size`` bytes held outside this process's memory: ``prefix`` (what was already
    read into it), then the rest in a pipe whose write end is closed (``fd`` is its read end). A channel
    splices it into the sandbox's (``WorkerIO.send_piped``); ``read`` copies it here where that cannot be.
    Whoever holds it last closes it (it also closes when collected)."""

    __slots__ = ("__weakref__", "fd", "prefix", "size")

    def __init__(self, prefix: bytes, fd: int, size: int) -> None:
        self.prefix, self.fd, self.size = prefix, fd, size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The whole body as bytes (the pipe is drained and closed); OSError if it holds fewer bytes."""
        parts = [self.prefix]
        left = self.size - len(self.prefix)
        try:
            while left:
                chunk = os.read(self.fd, left)
                if not chunk:
                    raise OSError(errno.EIO, "a piped body ended before its announced length")
                parts.append(chunk)
                left -= len(chunk)
        finally:
            self.close()
        return b"".join(parts)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


#: Pipes into a sandbox carry the context snapshot; the default 64 KiB buffer makes a 10 MB context cost
#: ~160 round trips between writer and reader, 1 MiB makes it 10 (about a third less time).
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031


def _pipe_max() -> int:
    try:
        return int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        return 0


#: The largest pipe buffer this process may ask for (``/proc/sys/fs/pipe-max-size``, read once; 0: unknown).
PIPE_MAX_BYTES = _pipe_max()


def widen_pipe(fd: int, size: int = PIPE_BYTES) -> None:
    """Grow a pipe's buffer to ``size`` (at most the system's cap); a pipe that cannot grow works as before."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, min(size, PIPE_MAX_BYTES or PIPE_BYTES))


class PipeIO(WorkerIO):
    """WorkerIO over the child's stdin (frames in), fd 3 (frames out), stdout and stderr."""

    def __init__(self, stdin_fd: int, streams: dict[int, Stream]) -> None:
        self.stdin_fd = stdin_fd
        #: A hand-off directory the runner confirmed (the runsc backend's; see ``sandbox/handoff.py``).
        self.handoff: HandoffDir | None = None
        self.selector = selectors.DefaultSelector()
        os.set_blocking(stdin_fd, False)  # every write waits in select, up to its deadline
        for fd, name in streams.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, name)

    def send(self, data: bytes, deadline: float | None = None) -> None:
        """Write all of ``data`` by ``deadline``; TimeoutError when the worker stops reading."""
        until = send_deadline(deadline)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.stdin_fd, view) :]
            except (BlockingIOError, InterruptedError):
                wait_writable(self.stdin_fd, until)

    def unread(self) -> int:
        """Bytes still in the pipe (the worker has not read them)."""
        return _ioctl_int(self.stdin_fd, termios.FIONREAD)

    def send_piped(self, head: bytes, body: PipedBody, deadline: float | None = None) -> None:
        """``head`` and the body's prefix in one write, then the body's pipe spliced into the channel (the
        kernel moves page references: the bytes never enter this process); bounded like ``send``."""
        until = send_deadline(deadline)
        try:
            self.send(head + body.prefix, until)
            left = body.size - len(body.prefix)
            while left:
                try:
                    moved = os.splice(body.fd, self.stdin_fd, left, flags=SPLICE_FLAGS)
                except (BlockingIOError, InterruptedError):
                    wait_writable(self.stdin_fd, until)
                    continue
                if not moved:
                    raise OSError(errno.EIO, "a piped body ended before its announced length")
                left -= moved
        finally:
            body.close()

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        chunks: list[tuple[Stream, bytes]] = []
        for key, _ in self.selector.select(timeout):
            fd = key.fd
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(fd)
            chunks.append((key.data, chunk))
        return chunks

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()


class SocketIO(PipeIO):
    """PipeIO whose frames-in channel is a unix stream socket, which can also pass descriptors: large
    context values travel as sealed memfds (see ``sandbox.exchange.send_execute``), not as bytes.

    With ``result_sock`` (the subprocess backend: ``result_channel``) the result channel is a unix socket
    too, read with ``recvmsg``: descriptors the runner attaches (its large output files) are collected as
    they come, whatever is read, and held for ``take_fds``; none can arrive unnoticed or stay open."""

    passes_fds = True

    def __init__(
        self, sock: socket.socket, streams: dict[int, Stream], result_sock: socket.socket | None = None
    ) -> None:
        super().__init__(sock.fileno(), streams)
        self.sock = sock
        self.result_sock = result_sock
        self._fds: list[int] = []
        self._truncated = False
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BYTES)

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        if self.result_sock is None:
            return super().poll(timeout)
        chunks: list[tuple[Stream, bytes]] = []
        result_fd = self.result_sock.fileno()
        for key, _ in self.selector.select(timeout):
            try:
                chunk = self._receive() if key.fd == result_fd else os.read(key.fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(key.fd)
            chunks.append((key.data, chunk))
        return chunks

    def _receive(self) -> bytes:
        assert self.result_sock is not None
        chunk, ancillary, flags, _ = self.result_sock.recvmsg(
            1 << 20, socket.CMSG_SPACE(MAX_RECEIVED_FDS * 4), socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT
        )
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self._fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
        if flags & socket.MSG_CTRUNC:
            self._truncated = True
        if len(self._fds) > MAX_RECEIVED_FDS:  # a sandbox sending descriptors on every byte: held at most so many
            for fd in self._fds[MAX_RECEIVED_FDS:]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            del self._fds[MAX_RECEIVED_FDS:]
            self._truncated = True
        return chunk

    def take_fds(self) -> tuple[list[int], bool]:
        fds, truncated = self._fds, self._truncated
        self._fds, self._truncated = [], False
        return fds, truncated

    def send_fds(self, data: bytes, fds: list[int], deadline: float | None = None) -> None:
        until = send_deadline(deadline)
        while True:
            try:
                sent = socket.send_fds(self.sock, [data], fds)
                break
            except (BlockingIOError, InterruptedError):
                wait_writable(self.stdin_fd, until)
        self.send(data[sent:], until)

    def unread(self) -> int:
        """Bytes sent on the socket that the worker has not read (SIOCOUTQ: its unconsumed send queue)."""
        return _ioctl_int(self.stdin_fd, termios.TIOCOUTQ)

    def close(self) -> None:
        super().close()
        self.sock.close()
        for fd in self.take_fds()[0]:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.result_sock is not None:
            self.result_sock.close()


def wait_fd(fd: int | socket.socket, timeout: float, *, write: bool = False) -> bool:
    """Wait up to ``timeout`` seconds until ``fd`` is readable (or writable, or closed); True when it is.
    ``poll``, not ``select``: a long-running server's descriptors pass 1024, where ``select`` raises."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


def wait_writable(fd: int, deadline: float) -> None:
    """Block until ``fd`` can take more bytes; TimeoutError once ``deadline`` (monotonic) has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the sandbox stopped reading its input")
    wait_fd(fd, remaining, write=True)


def _ioctl_int(fd: int, request: int) -> int:
    value: int = struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0]
    return value


#: At most this many descriptors are held from a result socket between two ``take_fds`` (the runner passes at
#: most ``MAX_PASSED_FDS`` in all); any more are closed at once (and ``take_fds`` says truncated), so a sandbox
#: sending descriptors with every byte cannot fill the host's descriptor table.
MAX_RECEIVED_FDS = 16


def result_channel() -> tuple[socket.socket, int]:
    """A unix stream socketpair for frames out of a sandbox: the host's end, and the sandbox's end as a bare
    descriptor (the caller passes it on and closes it). One way, like the pipe it replaces (the host's end is
    shut for writing); unlike a pipe it carries the descriptors of the runner's large output files, which the
    host checks and reads once (``sandbox/files.py``, ``read_passed_output``) instead of through the channel."""
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    host.shutdown(socket.SHUT_WR)
    host.setblocking(False)
    with contextlib.suppress(OSError):
        sandbox.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BYTES)
        host.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BYTES)
    return host, sandbox.detach()


def socket_channel() -> tuple[socket.socket, int]:
    """A unix stream socketpair for frames into a sandbox: the host's end, and the sandbox's end as a bare
    descriptor (the caller passes it on and closes it).

    One way only, like the pipe it replaces: the host's end is shut for reading, which shuts the sandbox's
    end for writing (EPIPE), so nothing (no bytes, no descriptors) can travel from the sandbox this way."""
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    host.shutdown(socket.SHUT_RD)
    return host, sandbox.detach()


__all__ = [
    "DEFAULT_SEND_TIMEOUT_S", "PIPE_BYTES", "PIPE_MAX_BYTES", "PipeIO", "PipedBody", "SocketIO", "Stream", "WorkerIO",
    "result_channel", "send_deadline", "socket_channel", "wait_fd", "wait_writable", "widen_pipe",
]  # fmt: skip
