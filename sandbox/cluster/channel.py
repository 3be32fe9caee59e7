"""The direct channel between a caller and a node's sandbox host: one TCP connection per execution in flight.

A Ray actor call costs 1.4-2.9 ms on this project's test machine before the host does anything (round 8), as
much as the whole dispatch budget. The host therefore also listens on its node's address, and the caller sends
``start``/``step`` there: a length-prefixed msgpack message each way, about 0.1 ms. Ray still does everything
else (the node table, placing and restarting host actors, health, cancellation, status) and hands the caller
the channel's address and secret through an authenticated actor call, so only a Ray-authorised caller can
open it. Where the caller cannot reach a node's address (a Ray Client outside the cluster's network), the
executor uses Ray's actor calls instead.

What crosses: the wire dicts of ``wire.py`` (JSON values, str, bytes), msgpack-encoded; never pickle. A peer
must present the host's 32-byte secret in its first message (at most ``HELLO_BYTES``, within ``HELLO_S``), or
the connection is closed without an answer. Both ends bound every message (``MAX_MESSAGE_BYTES``).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from sandforge.sandbox.cluster.wire import Wire

log = logging.getLogger(__name__)

#: A message's length prefix: 4 bytes, big-endian.
_LENGTH = struct.Struct(">I")
#: The largest message either end accepts (a request with its large context texts; an outcome).
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
#: The first message (the secret) is read with this bound, before anything is known of the peer.
HELLO_BYTES = 256
#: How long a new connection may take to present its secret.
HELLO_S = 5.0
#: How long connecting to a node's channel may take (a caller that cannot reach it uses Ray's calls).
CONNECT_S = 2.0
#: Connections one host serves at once (each holds a thread while it waits for its next message).
MAX_CONNECTIONS = 1024


class ChannelError(Exception):
    """The channel failed: the node is unreachable, went away mid-call, did not answer in time, or sent a
    malformed message. ``timeout`` tells a late answer from a lost node."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


def _msgpack() -> Any:
    """msgpack, imported when a channel is used: it comes with the cluster extra (Ray needs it too), and what
    imports this module for a name only (``sandforge deploy render``) must not need it."""
    import msgpack

    return msgpack


def encode(message: Wire) -> bytes:
    """One message as it travels: its length, then its msgpack body."""
    body: bytes = _msgpack().packb(message, use_bin_type=True)
    if len(body) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"message of {len(body)} bytes exceeds the channel's {MAX_MESSAGE_BYTES}")
    return _LENGTH.pack(len(body)) + body


def read_message(sock: socket.socket, limit: int = MAX_MESSAGE_BYTES) -> Wire:
    """The next message on ``sock`` (a dict); ChannelError if the peer closed, overran ``limit`` or sent
    something that is not a msgpack map."""
    (size,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if size > limit:
        raise ChannelError(f"peer announced a message of {size} bytes (limit {limit})")
    body = _read_exactly(sock, size)
    try:
        message = _msgpack().unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack's own errors: a malformed peer, never a reason to crash the reader
        raise ChannelError(f"malformed message: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise ChannelError(f"expected a map, got {type(message).__name__}")
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytearray:
    """``size`` bytes, read into one buffer (handed on as is: msgpack reads it without another copy)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ChannelError("the peer closed the connection")
        got += n
    return buffer


class ChannelServer:
    """The host's side: accepts connections on ``bind`` (the node's address), checks each one's secret and
    answers its messages with ``handle``, one thread per connection (a call may wait for its execution)."""

    def __init__(self, handle: Callable[[Wire], Wire], bind: str = "127.0.0.1") -> None:
        self.secret = secrets.token_bytes(32)
        self._handle = handle
        self._listener = socket.create_server((bind, 0), backlog=128)
        self.address: tuple[str, int] = (bind, self._listener.getsockname()[1])
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = False
        threading.Thread(target=self._accept, name="sandforge-channel", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # full: the caller sees a lost connection and uses another node or Ray's calls
                continue
            threading.Thread(target=self._serve, args=(conn,), name="sandforge-channel-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(HELLO_S)
                hello = read_message(conn, HELLO_BYTES)
                given = hello.get("secret")
                if not (isinstance(given, bytes) and hmac.compare_digest(given, self.secret)):
                    return  # no answer: a peer without the secret learns nothing
                conn.settimeout(None)
                conn.sendall(encode({"ok": True}))
                while not self._closed:
                    message = read_message(conn)
                    conn.sendall(self._answer(message))
        except (ChannelError, OSError, struct.error):
            pass  # the peer went away or misbehaved: its connection ends, nothing else does
        finally:
            self._slots.release()

    def _answer(self, message: Wire) -> bytes:
        try:
            return encode(self._handle(message))
        except Exception as exc:  # a handler bug or an answer msgpack cannot carry: the caller gets a typed failure
            log.exception("the channel could not answer a message")
            return encode({"kind": "error", "message": f"{type(exc).__name__}: {exc}"[:500]})

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()


class Channel:
    """The caller's side for one node: idle authenticated connections, reused; one per call in flight."""

    def __init__(self, address: tuple[str, int], secret: bytes) -> None:
        self.address = address
        self._secret = secret
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def connect(self) -> socket.socket:
        """A new authenticated connection; ChannelError if the node cannot be reached or refuses."""
        try:
            sock = socket.create_connection(self.address, timeout=CONNECT_S)
        except OSError as exc:
            raise ChannelError(f"cannot reach {self.address[0]}:{self.address[1]}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(encode({"secret": self._secret}))
            read_message(sock, HELLO_BYTES)
        except (OSError, ChannelError) as exc:
            sock.close()
            raise ChannelError(f"the node at {self.address[0]}:{self.address[1]} refused the channel: {exc}") from None
        return sock

    def call(self, message: Wire, timeout_s: float) -> Wire:
        """Send ``message`` and wait up to ``timeout_s`` for its answer."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self.connect()
        try:
            sock.settimeout(timeout_s)
            sock.sendall(encode(message))
            answer = read_message(sock)
        except TimeoutError:
            sock.close()
            raise ChannelError(f"no answer within {timeout_s:g}s", timeout=True) from None
        except (OSError, ChannelError) as exc:
            sock.close()
            raise ChannelError(f"the connection to the node failed: {exc}") from None
        if answer.get("kind") == "error":
            sock.close()
            raise ChannelError(f"the node could not answer: {answer.get('message')}")
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


__all__ = ["MAX_MESSAGE_BYTES", "Channel", "ChannelError", "ChannelServer", "encode", "read_message"]
