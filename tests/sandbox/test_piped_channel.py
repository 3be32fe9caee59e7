"""``WorkerIO.send_piped`` (issue 18): a body held in a pipe reaches the worker's channel exactly, after its
head, spliced on pipe and socket channels and read and sent elsewhere; a worker that stops reading cannot
hold the host past the deadline; the pipe is closed in every case."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest

from sandforge.sandbox.channel import PipedBody, PipeIO, SocketIO, WorkerIO

BODY = bytes(range(256)) * 2048  # 512 KiB


def piped(body: bytes, prefix: int = 1000) -> PipedBody:
    """``body`` as the broker stages it: a prefix in memory, the rest in a pipe whose write end is closed."""
    out, into = os.pipe()

    def write() -> None:  # a pipe holds 64 KiB by default: the rest is written while the channel drains it
        with contextlib.suppress(OSError):  # the reader closed the pipe early (the timeout test)
            os.write(into, body[prefix:])
        os.close(into)

    threading.Thread(target=write, daemon=True).start()
    return PipedBody(body[:prefix], out, len(body))


def receive(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Plain(WorkerIO):
    """A channel that can only send bytes (as Docker's attach socket): the default reads the pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, data: bytes, deadline: float | None = None) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def poll(self, timeout: float) -> list[tuple[str, bytes]]:  # type: ignore[override]
        return []


@pytest.mark.parametrize("kind", ["pipe", "socket", "plain"])
def test_the_head_then_exactly_the_body_reach_the_worker(kind: str) -> None:
    if kind == "socket":
        host, worker = socket.socketpair()
        io: WorkerIO = SocketIO(host, {})
        reader = worker.fileno()
    else:
        reader, writer = os.pipe()
        io = PipeIO(writer, {}) if kind == "pipe" else Plain(writer)
    body = piped(BODY)
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(receive(reader, 5 + len(BODY))))
    thread.start()
    io.send_piped(b"head:", body, time.monotonic() + 10)
    thread.join(10)
    assert got == [b"head:" + BODY] and body.fd == -1


def test_a_worker_that_stops_reading_is_a_timeout_and_the_pipe_is_closed() -> None:
    host, worker = socket.socketpair()
    io = SocketIO(host, {})
    host.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    body = piped(BODY * 8)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        io.send_piped(b"head:", body, time.monotonic() + 0.5)
    assert time.monotonic() - began < 5 and body.fd == -1
    worker.close()


def test_a_pipe_holding_fewer_bytes_than_announced_is_an_error_not_a_short_frame() -> None:
    out, into = os.pipe()
    os.write(into, b"x" * 100)
    os.close(into)
    body = PipedBody(b"", out, 200)
    reader, writer = os.pipe()
    with pytest.raises(OSError, match="ended before"):
        PipeIO(writer, {}).send_piped(b"", body, time.monotonic() + 5)
    assert body.fd == -1
    os.close(reader)
