"""Loopback HTTP(S) servers for the egress tests. Each records every request that reaches it (method,
path, headers, body, SNI), so a test can assert that a forbidden server received nothing. Every loop a
handler runs is bounded in count and time, and servers only ever bind loopback addresses."""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GZIP_BOMB_DECODED = 64 * 1024 * 1024
_BOMB = gzip.compress(b"\0" * GZIP_BOMB_DECODED, compresslevel=9)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    sni: str | None
    #: The client's address and port: which connection the request came on.
    peer: tuple[str, int] | None = None


@dataclass
class Server:
    host: str
    port: int
    tls: bool
    httpd: ThreadingHTTPServer
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    barrier: threading.Barrier | None = None

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "test"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> Seen:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        sni = getattr(self.connection, "sandforge_sni", None)
        if sni is None and isinstance(self.connection, ssl.SSLSocket):
            sni = getattr(self.server, "last_sni", None)
        headers = {k.lower(): v for k, v in self.headers.items()}
        seen = Seen(self.command, self.path, headers, body, sni, tuple(self.client_address[:2]))
        self.server.owner.seen.append(seen)  # type: ignore[attr-defined]
        return seen

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}) and "Transfer-Encoding" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        seen = self._record()
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        route = url.path
        handler = _Handler._echo if route.startswith("/public/") else _ROUTES.get(route, _Handler._hello)
        try:
            handler(self, seen, query)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    def _echo(self, seen: Seen, query: dict[str, str]) -> None:
        payload = {
            "method": seen.method,
            "path": seen.path,
            "headers": seen.headers,
            "body": seen.body.decode("latin-1"),
            "sni": seen.sni,
        }
        extra = {"Content-Type": "application/json"}
        if "authorization" in seen.headers:
            extra["X-Echo-Authorization"] = seen.headers["authorization"]
        self._send(200, json.dumps(payload).encode(), extra)

    def _redirect(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(int(query.get("code", "302")), b"", {"Location": query["to"]})

    def _loop(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(302, b"", {"Location": "/loop"})

    def _big(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(200, b"x" * int(query["n"]))

    def _gzipbomb(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(200, _BOMB, {"Content-Encoding": "gzip"})

    def _gzip(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(200, gzip.compress(b"hello gzip"), {"Content-Encoding": "gzip"})

    def _endless_route(self, seen: Seen, query: dict[str, str]) -> None:
        self._endless()

    def _drip_route(self, seen: Seen, query: dict[str, str]) -> None:
        self._drip(int(query.get("n", "40")), float(query.get("every", "0.1")))

    def _dripheaders(self, seen: Seen, query: dict[str, str]) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for index in range(60):
            self.wfile.write(f"X-Drip-{index}: {index}\r\n".encode())
            self.wfile.flush()
            time.sleep(0.1)
        self.wfile.write(b"Content-Length: 0\r\n\r\n")

    def _status(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(int(query["code"]), b"status body")

    def _wait(self, seen: Seen, query: dict[str, str]) -> None:
        owner: Server = self.server.owner  # type: ignore[attr-defined]
        assert owner.barrier is not None
        owner.barrier.wait(timeout=20)
        self._send(200, b"together")

    def _hangup(self, seen: Seen, query: dict[str, str]) -> None:
        """A kept-alive response, then the server closes the connection without saying so beforehand."""
        self._send(200, b"bye")
        self.close_connection = True

    def _extra(self, seen: Seen, query: dict[str, str]) -> None:
        """A response, then bytes nobody asked for on the same connection (a forged next response)."""
        self._send(200, b"first")
        self.wfile.flush()
        time.sleep(0.3)  # after the client read its response: the bytes wait in its socket
        forged = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
        self.wfile.write(forged)
        self.wfile.flush()

    def _hello(self, seen: Seen, query: dict[str, str]) -> None:
        self._send(200, b"hello", {"Content-Type": "text/plain"})

    def _endless(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"y" * 65536
        for _ in range(2048):  # at most 128 MiB, then stop: bounded even if nobody hangs up
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")

    def _drip(self, count: int, every: float) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(count))
        self.end_headers()
        for _ in range(count):
            self.wfile.write(b"z")
            self.wfile.flush()
            time.sleep(every)


#: Path -> what the handler does there (``/public/...`` echoes too; any other path says hello).
_ROUTES: dict[str, Callable[[_Handler, Seen, dict[str, str]], None]] = {
    "/echo": _Handler._echo,
    "/redirect": _Handler._redirect,
    "/loop": _Handler._loop,
    "/big": _Handler._big,
    "/gzipbomb": _Handler._gzipbomb,
    "/gzip": _Handler._gzip,
    "/endless": _Handler._endless_route,
    "/drip": _Handler._drip_route,
    "/dripheaders": _Handler._dripheaders,
    "/status": _Handler._status,
    "/wait": _Handler._wait,
    "/hangup": _Handler._hangup,
    "/extra": _Handler._extra,
}


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        super().__init__(address, _Handler)


def start(host: str = "127.0.0.1", port: int = 0, *, tls: ssl.SSLContext | None = None) -> Server:
    """A recording server on a loopback address (``port=0``: any free port)."""
    assert host.startswith("127.") or host == "::1", "test servers bind loopback only"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    httpd = _Httpd((host, port), family)
    server = Server(host, httpd.server_address[1], tls is not None, httpd)
    httpd.owner = server  # type: ignore[attr-defined]
    if tls is not None:
        context = tls

        def remember(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _ctx: ssl.SSLContext) -> None:
            sock.sandforge_sni = name  # type: ignore[union-attr]

        context.sni_callback = remember
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
