"""One HTTP exchange on a connection to an address the broker already checked.

The socket is connected to the checked address itself (never to a name, so nothing resolves again and DNS
rebinding cannot swap the target); TLS verifies the certificate against the URL's host name with SNI set.
The request is written with the standard library's `http.client` on that socket, which reads no proxy
variables and opens no connection of its own. A watchdog thread shuts the socket at the deadline, so a
server that drips bytes (headers or body) cannot hold a request past its timeout; bodies are capped as they
arrive and again after decompression (a gzip bomb stops at the cap).

Connections are kept alive within one execution's session (`ConnectionPool`): a connection is keyed by
everything its use was checked against (scheme, the host name TLS verified and ``Host`` names, port, and the
checked address it is connected to), and is handed out only for a request whose own checks (allow rule,
resolution, address verdicts: all made again for every request and hop) just returned that same address. So
reuse skips a TCP (and TLS) handshake, never a decision; a connection never outlives its session.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import os
import re
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from sandforge.runtime.egress.addresses import IPAddress, Verdict
from sandforge.runtime.egress.errors import EgressLimit, NetworkError
from sandforge.runtime.egress.urls import Target
from sandforge.sandbox import channel
from sandforge.sandbox.channel import SPLICE_FLAGS, PipedBody, wait_fd, widen_pipe

READ_CHUNK = 64 * 1024
#: A plain-HTTP body of at least this many bytes with a declared length, for a caller that takes a pipe
#: (`Outgoing.piped`), is spliced from the socket into a pipe (`stage`): never copied into this process.
PIPE_MIN_BYTES = 1 << 16
#: The largest pipe this process may make (a body larger than this is read as bytes); 0 without splice.
PIPE_MAX_BYTES = channel.PIPE_MAX_BYTES if hasattr(os, "splice") else 0
#: The size asked of each body's pipe (the largest: it holds page fragments, so a body may need more
#: than its length; one that still does not fit is read back as bytes, see `stage`).
PIPE_SIZE = PIPE_MAX_BYTES
#: Methods whose request may go on a kept-alive connection, and be sent again on a fresh one when the server
#: had closed it meanwhile (idempotent: RFC 9110 9.2.2). Other methods always get a new connection.
REUSABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
#: Idle connections one session keeps, and for how long.
MAX_IDLE = 8
IDLE_S = 15.0
#: What a kept-alive connection that the server closed while idle fails with, before any response.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


@dataclass(order=True, slots=True)
class _Watch:
    deadline: float
    seq: int
    sock: socket.socket | None = field(compare=False)
    fired: bool = field(default=False, compare=False)


class Watchdog:
    """Shuts sockets whose deadline passed. One thread for the process; arming and disarming take a lock
    for a heap operation only, never for the duration of a request.

    The thread wakes only for the deadline of an armed entry: disarmed ones (nearly every request ends
    before its deadline) are dropped from the top of the heap when it wakes, never waited for one by one
    (a wake-up per request, seconds later, took this process's GIL from the requests then running), and the
    heap is rebuilt without them once they are most of it (it stays bounded by the requests in flight)."""

    #: Rebuild the heap when it holds more than this many disarmed entries and they are most of it.
    COMPACT_AT = 1024

    def __init__(self) -> None:
        self._heap: list[_Watch] = []
        self._cond = threading.Condition(threading.Lock())  # never re-entered: a plain lock is cheaper
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._disarmed = 0  # disarmed entries still in the heap (approximately: popped ones are not counted down)

    def arm(self, sock: socket.socket, deadline: float) -> _Watch:
        watch = _Watch(deadline, next(self._seq), sock)
        with self._cond:
            heapq.heappush(self._heap, watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sandforge-egress-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0] is watch:  # only an earlier deadline needs the thread awake sooner
                self._cond.notify()
        return watch

    def disarm(self, watch: _Watch) -> None:
        watch.sock = None  # dropped when it reaches the top of the heap, or when the heap is rebuilt
        with self._cond:
            self._disarmed += 1
            if self._disarmed > self.COMPACT_AT and 2 * self._disarmed > len(self._heap):
                self._heap = [entry for entry in self._heap if entry.sock is not None]
                heapq.heapify(self._heap)
                self._disarmed = 0

    @property
    def pending(self) -> int:
        """Entries in the heap, armed or not (for tests)."""
        return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0].sock is None:  # disarmed: nothing to wait for
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                head = self._heap[0]
                if head.deadline > now:
                    self._cond.wait(head.deadline - now)
                    continue
                heapq.heappop(self._heap)
            sock = head.sock
            if sock is not None:
                head.fired = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes | PipedBody
    wire_bytes: int


#: A header field name: visible ASCII but the colon (RFC 9110's token is narrower; what the standard
#: library's parser accepted is kept).
_FIELD_NAME = re.compile(r"[!-9;-~]+")
#: `http.client`'s private bounds and helpers (header line length and count), which typeshed does not declare.
stdlib_client: Any = http.client


class _Headers:
    """A response's header fields in order: what `http.client` reads of them (``get``, ``get_all``,
    ``items``), without parsing them as an e-mail message (the standard library's parser costs more CPU
    than the rest of a small response)."""

    __slots__ = ("fields",)

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        return next((value for key, value in self.fields if key.lower() == name), default)

    def get_all(self, name: str, default: list[str] | None = None) -> list[str] | None:
        name = name.lower()
        return [value for key, value in self.fields if key.lower() == name] or default

    def items(self) -> list[tuple[str, str]]:
        return list(self.fields)


def read_fields(fp: BinaryIO) -> list[tuple[str, str]]:
    """The header fields up to the empty line, within the standard library's bounds (lines, count).
    Stricter than its e-mail parser: a line that is not ``name: value`` (or a folded continuation of the
    previous one, unfolded with a space) is a protocol error, never the start of a body."""
    fields: list[tuple[str, str]] = []
    while True:
        line = fp.readline(stdlib_client._MAXLINE + 1)
        if len(line) > stdlib_client._MAXLINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return fields
        if len(fields) >= stdlib_client._MAXHEADERS:
            raise http.client.HTTPException(f"got more than {stdlib_client._MAXHEADERS} headers")
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):
            if not fields:
                raise http.client.HTTPException("a folded header line with no header before it")
            name, value = fields[-1]
            fields[-1] = (name, value + " " + text.strip(" \t"))
            continue
        name, colon, value = text.partition(":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise http.client.HTTPException(f"malformed header line {text[:60]!r}")
        fields.append((name, value.lstrip(" \t")))


class PinnedResponse(http.client.HTTPResponse):
    """`http.client`'s response with its header fields read by `read_fields`; everything else (status
    line, framing, chunked bodies, closing) is the standard library's."""

    def begin(self) -> None:
        if self.headers is not None:
            return
        stdlib: Any = self  # its private helpers, which typeshed does not declare
        while True:  # skip interim 100 responses, as the standard library does
            version, status, reason = stdlib._read_status()
            if status != http.client.CONTINUE:
                break
            stdlib_client._read_headers(self.fp)
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        stdlib.headers = stdlib.msg = _Headers(read_fields(self.fp))
        self._frame(status, stdlib)

    def _frame(self, status: int, stdlib: Any) -> None:
        """Chunked or not, whether the connection closes, the body's length: as the standard library decides."""
        coding = self.headers.get("transfer-encoding")
        self.chunked = coding is not None and coding.lower() == "chunked"
        self.chunk_left = None
        self.will_close = stdlib._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            with contextlib.suppress(ValueError):
                self.length = int(length)
            if self.length is not None and self.length < 0:
                self.length = None
        interim = 100 <= status < 200 or status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
        if interim or stdlib._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


class _PinnedConnection(http.client.HTTPConnection):
    """`http.client` on a socket the broker connected; it never connects (or resolves) by itself."""

    response_class = PinnedResponse

    def __init__(self, sock: socket.socket, target: Target, timeout: float) -> None:
        super().__init__(target.host_text, target.port, timeout=timeout)
        self.sock = sock

    def connect(self) -> None:  # pragma: no cover - the socket is always given
        raise NetworkError("internal: the pinned connection has no socket", reason="internal")


def _connect(target: Target, verdicts: Sequence[Verdict], timeout: float) -> tuple[socket.socket, IPAddress]:
    """A socket connected to the first reachable checked address, and that address."""
    last: OSError | None = None
    for verdict in verdicts:
        address = verdict.connect
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((str(address), target.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, address
        except OSError as exc:
            sock.close()
            last = exc
    what = f"{last.strerror or type(last).__name__}" if last is not None else "no address"
    if isinstance(last, TimeoutError | socket.timeout):
        what = "timed out"
    raise NetworkError(f"cannot connect to {target.authority}: {what}", reason="connect")


#: scheme, host name (what TLS verified), port, the checked address the connection is connected to.
PoolKey = tuple[str, str, int, IPAddress]


def pool_key(target: Target, address: IPAddress) -> PoolKey:
    return (target.scheme, target.host, target.port, address)


class ConnectionPool:
    """One session's idle kept-alive connections (at most `MAX_IDLE`, each idle at most `IDLE_S`). Its lock
    is held for a dictionary operation only, never during a request: fetches of a session run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[PoolKey, list[tuple[float, _PinnedConnection]]] = {}
        self._count = 0
        self._closed = False

    def take(self, key: PoolKey) -> _PinnedConnection | None:
        """An idle connection for `key` that the server has not closed, or None."""
        while True:
            with self._lock:
                held = self._idle.get(key)
                if not held:
                    return None
                since, conn = held.pop()
                self._count -= 1
            if time.monotonic() - since <= IDLE_S and not _dropped(conn.sock):
                return conn
            conn.close()

    def give(self, key: PoolKey, conn: _PinnedConnection) -> None:
        """Keep `conn` for the next request with the same key (closed instead when the pool is full or closed)."""
        with self._lock:
            if not self._closed and self._count < MAX_IDLE:
                self._idle.setdefault(key, []).append((time.monotonic(), conn))
                self._count += 1
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection; connections given back afterwards are closed at once."""
        with self._lock:
            self._closed = True
            held = [conn for conns in self._idle.values() for _, conn in conns]
            self._idle.clear()
            self._count = 0
        for conn in held:
            conn.close()

    @property
    def idle(self) -> int:
        return self._count


def _dropped(sock: socket.socket | None) -> bool:
    """An idle connection is unusable when it is gone or readable: the server closed it (EOF) or sent
    something unasked, which must not be read as the next request's response."""
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():  # decrypted bytes waiting that poll cannot see
        return True
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """One request as the broker sends it on one hop: where, what, by when, and how much body it takes
    (`cap` bytes, named `cap_what` in the error). The body is read only when `read_body`."""

    target: Target
    method: str
    headers: Sequence[tuple[str, str]]
    body: bytes | None
    deadline: float
    cap: int
    cap_what: str
    read_body: bool = True
    #: The caller takes a plain body as a `PipedBody` (it forwards the body and never looks into it).
    piped: bool = False


def exchange(
    request: Outgoing, verdicts: Sequence[Verdict], ssl_context: ssl.SSLContext, pool: ConnectionPool | None = None
) -> RawResponse:
    """Send one request to a checked address and read the response (the body only when `read_body`),
    decoded and within `cap` bytes. Raises NetworkError / EgressLimit.

    With a `pool`, an idempotent request first goes on an idle connection to one of `verdicts`' addresses
    (in their order), and a connection whose response ended cleanly is given back to it; a kept-alive
    connection the server closed meanwhile is dropped and the request sent on a new one."""
    target = request.target
    if pool is not None and request.method in REUSABLE_METHODS:
        for verdict in verdicts:
            key = pool_key(target, verdict.connect)
            conn = pool.take(key)
            if conn is not None:
                try:
                    return _on(conn, key, request, pool, reused=True)
                except _StaleConnection:
                    break
    remaining = request.deadline - time.monotonic()
    if remaining <= 0:
        raise NetworkError(f"{target.url}: timed out before connecting", reason="timeout")
    sock, address = _connect(target, verdicts, remaining)
    if target.scheme == "https":
        watch = WATCHDOG.arm(sock, request.deadline)
        try:
            sock = _wrap_tls(sock, target, ssl_context, watch)
        except BaseException:
            with contextlib.suppress(OSError):
                sock.close()
            raise
        finally:
            WATCHDOG.disarm(watch)
    conn = _PinnedConnection(sock, target, remaining)
    return _on(conn, pool_key(target, address), request, pool, reused=False)


class _StaleConnection(Exception):
    """A kept-alive connection failed before any response: the server had closed it."""


def _on(
    conn: _PinnedConnection, key: PoolKey, request: Outgoing, pool: ConnectionPool | None, *, reused: bool
) -> RawResponse:
    """One request on `conn`, bounded by the request's deadline; `conn` goes back to `pool` if its response
    ended cleanly, else it is closed."""
    target = request.target
    sock = conn.sock
    assert sock is not None
    watch = WATCHDOG.arm(sock, request.deadline)
    keep = False
    try:
        sock.settimeout(max(0.001, request.deadline - time.monotonic()))
        raw, keep = _send_and_receive(conn, request, watch)
        return raw
    except (EgressLimit, NetworkError):
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # the watchdog's shutdown can surface as anything (a reset, an early end, a cut header line): a
        # request past its deadline is a timeout whatever the socket said
        if watch.fired or isinstance(exc, TimeoutError | socket.timeout):
            raise NetworkError(f"{target.url}: timed out", reason="timeout") from None
        if reused and isinstance(exc, _STALE):
            raise _StaleConnection from exc
        raise NetworkError(f"{target.url}: {_describe(exc)}", reason="protocol") from None
    finally:
        WATCHDOG.disarm(watch)
        if keep and pool is not None and not watch.fired:
            pool.give(key, conn)
        else:
            conn.close()


def _wrap_tls(sock: socket.socket, target: Target, ssl_context: ssl.SSLContext, watch: _Watch) -> ssl.SSLSocket:
    try:
        return ssl_context.wrap_socket(sock, server_hostname=target.host)
    except ssl.SSLCertVerificationError as exc:
        raise NetworkError(
            f"TLS with {target.authority} failed: {exc.verify_message or 'certificate verify failed'}",
            reason="tls",
        ) from None
    except (ssl.SSLError, OSError) as exc:
        if watch.fired:
            raise NetworkError(f"{target.url}: timed out during the TLS handshake", reason="timeout") from None
        raise NetworkError(f"TLS with {target.authority} failed: {exc}", reason="tls") from None


def _send_and_receive(conn: _PinnedConnection, request: Outgoing, watch: _Watch) -> tuple[RawResponse, bool]:
    """The response, and whether the connection may carry another request (the response ended cleanly
    and the server keeps the connection open)."""
    target = request.target
    conn.putrequest(request.method, target.request_target, skip_host=True, skip_accept_encoding=True)
    for name, value in request.headers:
        conn.putheader(name, value)
    conn.endheaders(request.body)
    _quick_ack(conn.sock)
    response = conn.getresponse()
    status, reason = response.status, response.reason
    raw_headers = [(k, v) for k, v in response.getheaders()]
    if request.method == "HEAD":
        response.read()  # no body: ends the response
        return RawResponse(status, reason, raw_headers, b"", 0), _clean(response)
    if not request.read_body:
        return RawResponse(status, reason, raw_headers, b"", 0), False
    encoding = (response.getheader("content-encoding") or "").strip().lower()
    decoded: bytes | PipedBody
    sock = conn.sock
    if _pipes(request, response, sock, encoding):
        assert sock is not None and response.length is not None  # what _pipes checked
        decoded, wire = stage(response, sock, response.length, request, watch)
    else:
        decoded, wire = _read_body(response, encoding, request)
    if watch.fired:  # the watchdog shut the socket: what arrived is a prefix, not the body
        raise NetworkError(f"{target.url}: timed out", reason="timeout")
    if response.length:  # http.client returns b"" at an early EOF of a Content-Length body
        raise NetworkError(f"{target.url}: {_describe(http.client.IncompleteRead(b''))}", reason="protocol")
    return RawResponse(status, reason, raw_headers, decoded, wire), _clean(response)


def _pipes(request: Outgoing, response: http.client.HTTPResponse, sock: socket.socket | None, encoding: str) -> bool:
    """Whether the body goes into a pipe (`stage`): the caller takes one, the connection is plain TCP (a TLS
    record must be decrypted here), the body is framed by a declared length within the cap (chunked and
    length-less bodies keep the capped read) and is not to be decompressed, and a pipe can hold it."""
    length = response.length
    return (
        request.piped
        and type(sock) is socket.socket
        and not response.chunked
        and length is not None
        and PIPE_MIN_BYTES <= length <= min(request.cap, PIPE_MAX_BYTES)
        and _decoder(encoding) is None
    )


def stage(
    response: http.client.HTTPResponse, sock: socket.socket, length: int, request: Outgoing, watch: _Watch
) -> tuple[bytes | PipedBody, int]:
    """Exactly `length` body bytes: what the header read left in the response's buffer, then the rest
    spliced from the socket into a new pipe, never through this process's memory. Nothing of it is handed
    on before all of it arrived, so an early end, a reset or the deadline is an error as on the read path
    (and a longer body's excess is never taken: it stays on the socket, which the pool then drops). When the
    pipe fills before the body is whole (a pipe holds page fragments, not bytes), what it holds is read
    back and the rest read as bytes."""
    fp = response.fp
    assert fp is not None
    prefix = fp.read1(min(length, len(fp.peek(0)))) if length else b""
    left = length - len(prefix)
    out, into = os.pipe2(os.O_CLOEXEC)
    body = PipedBody(prefix, out, length)
    try:
        widen_pipe(into, PIPE_SIZE)
        left = _splice_in(sock, into, left, request, watch)
        os.close(into)
        into = -1
        if left:  # the pipe is full: what it holds and the rest, as bytes
            held = _drain(out)
            rest = fp.read(left)
            if len(rest) != left:
                raise http.client.IncompleteRead(rest, left - len(rest))
            body.close()
            response.length = 0
            response.close()
            return prefix + held + rest, length
    except BaseException:
        body.close()
        raise
    finally:
        if into >= 0:
            os.close(into)
    response.length = 0  # the body is taken: the response is complete, its connection reusable
    response.close()
    return body, length


def _drain(fd: int) -> bytes:
    """Everything in a pipe whose write end is closed."""
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def _splice_in(sock: socket.socket, into: int, left: int, request: Outgoing, watch: _Watch) -> int:
    """Splice up to `left` bytes from `sock` into the pipe `into`; what is left when the pipe filled up.
    Waits for the socket within the request's deadline (the watchdog also shuts it then)."""
    fd = sock.fileno()
    stalled = False
    while left:
        try:
            moved = os.splice(fd, into, left, flags=SPLICE_FLAGS)
        except (BlockingIOError, InterruptedError):
            if stalled:
                return left  # the socket was readable, yet nothing moved: the pipe is full
            remaining = request.deadline - time.monotonic()
            if remaining <= 0 or not wait_fd(fd, remaining):
                raise TimeoutError("body") from None
            stalled = True
            continue
        stalled = False
        if not moved:
            if watch.fired:
                raise TimeoutError("body")
            raise http.client.IncompleteRead(b"", left)
        left -= moved
    return 0


#: Linux's TCP_QUICKACK (None elsewhere), looked up once rather than per request.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _quick_ack(sock: socket.socket | None) -> None:
    """Acknowledge the response's segments at once. On a kept-alive connection Linux delays ACKs (its
    request/response heuristic); a server that writes headers and body apart without TCP_NODELAY (Python's
    http.server does) then holds the body back until that delayed ACK: 40 ms per request. Leaving that mode
    after each request costs one setsockopt."""
    if sock is not None and _QUICKACK is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def _clean(response: http.client.HTTPResponse) -> bool:
    """The response was read to its end and the server did not ask to close the connection."""
    return response.isclosed() and not response.will_close


def _describe(exc: BaseException) -> str:
    if isinstance(exc, http.client.IncompleteRead):
        return "connection closed before the whole body arrived"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "server closed the connection without a response"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _decoder(encoding: str) -> zlib._Decompress | None:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    return None


def _over(request: Outgoing) -> EgressLimit:
    return EgressLimit(
        f"response from {request.target.url} is larger than {request.cap_what} ({request.cap} bytes)", reason="size"
    )


def _wire_cap(cap: int) -> int:
    """How many bytes may arrive for a body of at most `cap` bytes (a little framing and compression slack)."""
    return cap + cap // 64 + 4096


def _read_body(response: http.client.HTTPResponse, encoding: str, request: Outgoing) -> tuple[bytes, int]:
    """The decoded body and the bytes that arrived for it, within ``request.cap``."""
    decoder = _decoder(encoding)
    if decoder is not None:
        return _read_decoded(response, decoder, encoding, request)
    if response.length is not None and not response.chunked:
        if response.length > request.cap:  # announced too large: refused before reading any of it
            raise _over(request)
        body = response.read(response.length)  # the watchdog bounds the time; an early EOF leaves length > 0
        return body, len(body)
    return _read_plain(response, request)


def _read_plain(response: http.client.HTTPResponse, request: Outgoing) -> tuple[bytes, int]:
    cap = request.cap
    wire_cap = _wire_cap(cap)
    out = bytearray()
    wire = 0
    while True:
        chunk = response.read1(READ_CHUNK)
        if not chunk:
            break
        wire += len(chunk)
        if wire > wire_cap:
            raise _over(request)
        out += chunk
        if len(out) > cap:
            raise _over(request)
    return bytes(out), wire


def _read_decoded(
    response: http.client.HTTPResponse, decoder: zlib._Decompress, encoding: str, request: Outgoing
) -> tuple[bytes, int]:
    """A gzip / deflate body, decompressed as it arrives and never past ``cap + 1`` bytes of output."""
    cap = request.cap
    wire_cap = _wire_cap(cap)
    out = bytearray()
    wire = 0
    while True:
        chunk = response.read1(READ_CHUNK)
        if not chunk:
            break
        wire += len(chunk)
        if wire > wire_cap:
            raise _over(request)
        try:
            _inflate(decoder, chunk, out, cap)
        except zlib.error as exc:
            if encoding != "deflate" or out or wire != len(chunk):
                raise NetworkError(
                    f"{request.target.url}: corrupt {encoding} body ({exc})", reason="protocol"
                ) from None
            decoder = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send
            out += decoder.decompress(chunk, cap + 1)
        if len(out) > cap:
            raise _over(request)
    out += decoder.flush(cap + 1 - len(out)) if len(out) <= cap else b""
    if len(out) > cap:
        raise _over(request)
    return bytes(out), wire


def _inflate(decoder: zlib._Decompress, chunk: bytes, out: bytearray, cap: int) -> None:
    """Append what `chunk` decompresses to, up to ``cap + 1`` bytes in `out` (one past the cap tells it is over)."""
    out += decoder.decompress(chunk, cap + 1 - len(out))
    while decoder.unconsumed_tail and len(out) <= cap:
        out += decoder.decompress(decoder.unconsumed_tail, cap + 1 - len(out))
