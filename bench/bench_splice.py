"""Micro-benchmark before changing the broker (issue 18, 1 MB goal): how the host forwards a plain-HTTP body
with a known Content-Length from a loopback server to another process's channel, per MiB.

The "sandbox" is a forked process holding the far end of a unix stream socketpair, reading each body as the
runner does (a 4-byte length, then ``recv(n, MSG_WAITALL)`` into a ``bytes``), then acknowledging on a pipe.
The host reads the response's status line and header fields with ``http.client`` (``PinnedResponse``, as the
broker does) on one kept-alive connection, then forwards the body by:

- ``copy``: ``response.read(length)`` into a fresh ``bytes``, then ``sendall`` (the broker and exchange today);
- ``recv_into``: ``recv_into`` a reused buffer (``MSG_WAITALL``), then ``sendmsg`` from it;
- ``splice``: the socket into a pipe (``os.splice``: page references, no copy in host user space) until the
  whole declared length is there, then the length prefix, then the pipe into the channel (``os.splice``);
  nothing is sent before the body is complete, so a short body can still become an error reply.

"direct" is the host alone reading the same response (the bench's baseline). For each: p50 of the time from
the request to the sandbox's acknowledgement (end to end), and this thread's CPU per fetch
(``time.thread_time``: what one GIL must pay per MiB).

    python bench/bench_splice.py [--rounds N] [--size BYTES]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import select
import socket
import statistics
import struct
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sandforge.runtime.egress.transport import PinnedResponse
from sandforge.sandbox.channel import widen_pipe

HEADER = struct.Struct(">I")
BODY: list[bytes] = [b""]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY[0])))
        self.end_headers()
        self.wfile.write(BODY[0])


def _reader(sock: socket.socket, ack: int) -> None:
    """The sandbox's side: length, then the body as one ``bytes`` (``MSG_WAITALL``), then one byte back."""
    while True:
        head = sock.recv(HEADER.size, socket.MSG_WAITALL)
        if len(head) < HEADER.size:
            return
        (size,) = HEADER.unpack(head)
        body = sock.recv(size, socket.MSG_WAITALL)
        if len(body) != size:
            return
        os.write(ack, b"k")


class Host:
    def __init__(self, port: int, channel: socket.socket, ack: int, size: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.conn.response_class = PinnedResponse
        self.channel, self.ack, self.size = channel, ack, size
        self.buffer = bytearray(size)
        self.pipe_r, self.pipe_w = os.pipe()
        widen_pipe(self.pipe_w, 4 * size)  # room for the body's page fragments

    def _response(self) -> http.client.HTTPResponse:
        self.conn.request("GET", "/")
        response = self.conn.getresponse()
        assert response.length == self.size
        return response

    def _done(self) -> None:
        assert os.read(self.ack, 1) == b"k"

    def direct(self) -> None:
        assert len(self._response().read()) == self.size

    def copy(self) -> None:
        body = self._response().read()
        self.channel.sendall(HEADER.pack(len(body)))
        self.channel.sendall(body)
        self._done()

    def recv_into(self) -> None:
        response = self._response()
        fp = response.fp
        assert fp is not None and self.conn.sock is not None
        view = memoryview(self.buffer)
        got = fp.readinto(view[: len(fp.peek(0)[: self.size])]) if self.size else 0  # the header read's rest
        sock = self.conn.sock
        while got < self.size:
            try:
                n = sock.recv_into(view[got:], self.size - got, socket.MSG_WAITALL)
            except BlockingIOError:
                select.select([sock], [], [])
                continue
            assert n
            got += n
        response.length = 0
        response.close()  # closes its file, not the connection: http.client reuses the socket
        self.channel.sendmsg([HEADER.pack(self.size), view[: self.size]])
        self._done()

    def splice(self) -> None:
        response = self._response()
        fp = response.fp
        assert fp is not None and self.conn.sock is not None
        prefix = fp.read1(len(fp.peek(0)[: self.size])) if self.size else b""
        left = self.size - len(prefix)
        fd = self.conn.sock.fileno()
        while left:
            try:
                n = os.splice(fd, self.pipe_w, left, flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                select.select([fd], [], [])
                continue
            assert n
            left -= n
        response.length = 0
        response.close()
        self.channel.sendall(HEADER.pack(self.size) + prefix)
        left = self.size - len(prefix)
        out = self.channel.fileno()
        while left:
            try:
                n = os.splice(self.pipe_r, out, left, flags=os.SPLICE_F_MOVE)
            except BlockingIOError:
                select.select([], [out], [])
                continue
            left -= n
        self._done()


def run(rounds: int, size: int) -> None:
    BODY[0] = b"x" * size
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    serving = multiprocessing.get_context("fork").Process(target=server.serve_forever, daemon=True)
    serving.start()
    host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    host_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    ack_r, ack_w = os.pipe()
    reader = multiprocessing.get_context("fork").Process(target=_reader, args=(sandbox_end, ack_w), daemon=True)
    reader.start()
    sandbox_end.close()
    host = Host(server.server_address[1], host_end, ack_r, size)
    ways: dict[str, Callable[[], None]] = {
        "direct": host.direct, "copy": host.copy, "recv_into": host.recv_into, "splice": host.splice,
    }  # fmt: skip
    for way in ways.values():  # warm-up (connection, pages)
        for _ in range(5):
            way()
    wall: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for _ in range(rounds):  # interleaved: drift in load hits all alike
        for name, way in ways.items():
            began, began_cpu = time.perf_counter(), time.thread_time()
            way()
            cpu[name] += time.thread_time() - began_cpu
            wall[name].append(time.perf_counter() - began)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    mib = size / (1 << 20)
    direct = statistics.median(wall["direct"])
    print(f"{size} bytes, {rounds} rounds each, interleaved; host CPU per MiB = this thread's CPU / MiB")
    print(f"{'way':>10} {'p50 ms':>8} {'vs direct':>9} {'host CPU us/MiB':>16} {'less direct':>12}")
    for name in ways:
        p50 = statistics.median(wall[name])
        per = cpu[name] / rounds / mib * 1e6
        extra = (cpu[name] - cpu["direct"]) / rounds / mib * 1e6
        print(f"{name:>10} {p50 * 1e3:>8.3f} {p50 / direct:>8.2f}x {per:>16.0f} {extra:>12.0f}")
    host_end.close()
    reader.join(5)
    serving.terminate()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()
    run(args.rounds, args.size)


if __name__ == "__main__":
    main()
