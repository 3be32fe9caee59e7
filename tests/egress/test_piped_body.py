"""A large plain-HTTP body with a declared length, for a caller that forwards it (the exchange), is spliced
from the server's socket into a pipe (``transport.stage``) and from there into the sandbox's channel, never
copied into the host's memory. The limits and the failure modes stay the read path's: nothing is handed on
before the whole declared length arrived, so a server that lies about Content-Length, stops early, resets
mid-body or drips past the timeout gives the same typed errors, and the channel's framing stays whole.
Chunked, compressed, TLS and credentialed responses keep the read path. Servers here are scripted raw TCP
on loopback, so each lie is exact."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from sandforge.runtime.agent.egress import ExecutionEgress, StandaloneBridge
from sandforge.runtime.egress import EgressBroker, EgressPolicy, EgressSection, transport
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox
from sandforge.sandbox.channel import PipedBody
from sandforge.sandbox.exchange import no_bridge
from sandforge.sandbox.protocol import BridgeReply, CallFrame

pytestmark = pytest.mark.netns

BIG = bytes(range(256)) * 1024  # 256 KiB, every byte value: a shifted or truncated copy shows
Script = Callable[[socket.socket], None]


def head(length: int, **headers: str) -> bytes:
    lines = [b"HTTP/1.1 200 OK", f"Content-Length: {length}".encode()]
    lines += [f"{name.replace('_', '-')}: {value}".encode() for name, value in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def whole(body: bytes) -> Script:
    return lambda conn: conn.sendall(head(len(body)) + body)


def short(conn: socket.socket) -> None:
    """Declares BIG's length, sends half of it, closes."""
    conn.sendall(head(len(BIG)) + BIG[: len(BIG) // 2])
    conn.shutdown(socket.SHUT_WR)


def reset(conn: socket.socket) -> None:
    """Half the body, then a reset (SO_LINGER 0)."""
    conn.sendall(head(len(BIG)) + BIG[: len(BIG) // 2])
    time.sleep(0.05)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def longer(conn: socket.socket) -> None:
    """BIG, then bytes past the declared length that look like the next response."""
    conn.sendall(head(len(BIG)) + BIG + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")


def drip(conn: socket.socket) -> None:
    """Half the body at once, then a byte every 0.2 s: far slower than the timeout allows."""
    conn.sendall(head(len(BIG)) + BIG[: len(BIG) // 2])
    for index in range(40):
        time.sleep(0.2)
        conn.sendall(BIG[len(BIG) // 2 + index : len(BIG) // 2 + index + 1])


class Scripted:
    """A loopback server answering each request (on whichever connection) with the next script; it counts
    connections. A script that closes the connection ends it."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.scripts:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            buffered = b""
            while self.scripts:
                while b"\r\n\r\n" not in buffered:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffered += data
                buffered = buffered.split(b"\r\n\r\n", 1)[1]
                try:
                    self.scripts.pop(0)(conn)
                except OSError:
                    return

    def close(self) -> None:
        self.scripts.clear()
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def start(*scripts: Script) -> Scripted:
        made.append(Scripted(list(scripts)))
        return made[-1]

    yield start
    for server in made:
        server.close()


def broker(port: int, **limits: Any) -> EgressBroker:
    section = EgressSection.model_validate(
        {
            "allow": [{"url": f"http://piped.test:{port}/**"}],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"piped.test": "127.0.0.1"},
            "limits": limits,
        }
    )
    return EgressBroker(EgressPolicy().merge(section))


def pipes() -> int:
    """Pipes this process holds open (a piped body that is not closed leaks one)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count


def fetch(session: Any, port: int, path: str = "/x") -> tuple[dict[str, Any], bytes | PipedBody | None]:
    reply: tuple[dict[str, Any], bytes | PipedBody | None] = session.handle_request(
        {"url": f"http://piped.test:{port}{path}"}, piped=True
    )
    return reply


def body_of(body: bytes | PipedBody | None) -> bytes | None:
    return body.read() if isinstance(body, PipedBody) else body


# --- what is piped, and what is not ------------------------------------------------------------------------


def test_a_large_plain_body_comes_as_a_pipe_holding_exactly_it(serve: Callable[..., Scripted]) -> None:
    server = serve(whole(BIG), whole(BIG))
    session = broker(server.port).session()
    before = pipes()
    reply, body = fetch(session, server.port)
    assert isinstance(body, PipedBody) and len(body) == len(BIG)
    assert reply["error"] is None and reply["response"]["status"] == 200
    assert body.read() == BIG and pipes() == before  # read closes it
    assert session.records[-1].bytes == len(BIG)
    # the same response read as bytes (a caller that does not take a pipe), on the same kept-alive connection
    _, copied = session.handle_request({"url": f"http://piped.test:{server.port}/x"})
    assert copied == BIG and server.connections == 1


def test_a_pipe_too_small_for_the_body_falls_back_to_bytes(
    serve: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = BIG * 4  # 1 MiB into a 64 KiB pipe: it fills long before the body is whole
    monkeypatch.setattr(transport, "PIPE_SIZE", 1 << 16)
    server = serve(whole(big))
    before = pipes()
    _, body = fetch(broker(server.port).session(), server.port)
    assert body == big and pipes() == before


GZIPPED = gzip.compress(BIG)
CHUNKED = b"".join(b"%x\r\n%s\r\n" % (len(BIG[i : i + 50000]), BIG[i : i + 50000]) for i in range(0, len(BIG), 50000))


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (whole(BIG[:4096]), BIG[:4096]),
        (lambda conn: conn.sendall(head(len(GZIPPED), Content_Encoding="gzip") + GZIPPED), BIG),
        (lambda conn: conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + CHUNKED + b"0\r\n\r\n"), BIG),
    ],
    ids=["small", "gzip", "chunked"],
)  # fmt: skip
def test_small_compressed_and_chunked_bodies_stay_bytes(
    serve: Callable[..., Scripted], script: Script, expected: bytes
) -> None:
    server = serve(script)
    _, body = fetch(broker(server.port).session(), server.port)
    assert isinstance(body, bytes) and body == expected


def test_a_policy_that_injects_a_credential_gets_bytes(serve: Callable[..., Scripted]) -> None:
    """The body is searched for the injected secret (redaction), so it must be in this process."""
    secret = "s3cr3t-token-value"
    server = serve(lambda conn: conn.sendall(head(len(BIG) + len(secret)) + BIG + secret.encode()))
    section = EgressSection.model_validate(
        {
            "allow": [{"url": f"http://piped.test:{server.port}/**"}],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"piped.test": "127.0.0.1"},
            "credentials": [
                {"host": "piped.test", "header": "Authorization", "value": "Bearer ${PIPED_TOKEN}", "schemes": ["http"]}
            ],
        }
    )
    session = EgressBroker(EgressPolicy().merge(section), environ={"PIPED_TOKEN": secret}).session()
    _, body = fetch(session, server.port)
    assert isinstance(body, bytes) and secret.encode() not in body and body.startswith(BIG)


# --- the attacks: every one is the read path's error, and no pipe is left open --------------------------


@pytest.mark.parametrize(
    ("script", "reason", "words"),
    [(short, "protocol", "closed before the whole body"), (reset, "protocol", "")],
    ids=["shorter than declared", "reset mid-body"],
)
def test_a_body_that_ends_early_is_a_network_error(
    serve: Callable[..., Scripted], script: Script, reason: str, words: str
) -> None:
    server = serve(script)
    before = pipes()
    reply, body = fetch(broker(server.port).session(), server.port)
    assert body is None and reply["error"]["kind"] == "network_error", reply
    assert reply["error"]["reason"] == reason and words in reply["error"]["message"]
    assert pipes() == before


def test_bytes_past_the_declared_length_are_never_taken(serve: Callable[..., Scripted]) -> None:
    server = serve(longer, whole(b"second"))
    session = broker(server.port).session()
    _, body = fetch(session, server.port)
    assert isinstance(body, PipedBody) and body.read() == BIG
    # the excess is still on the socket: the kept connection is dropped, never read as the next response
    _, second = fetch(session, server.port)
    assert second == b"second" and server.connections == 2


def test_a_drip_past_the_timeout_is_a_timeout(serve: Callable[..., Scripted]) -> None:
    server = serve(drip)
    before = pipes()
    began = time.monotonic()
    reply, body = fetch(broker(server.port, timeout_s=1).session(), server.port)
    assert body is None and reply["error"]["kind"] == "network_error" and reply["error"]["reason"] == "timeout"
    assert time.monotonic() - began < 5
    assert pipes() == before


def test_a_declared_length_over_the_size_limit_is_refused(serve: Callable[..., Scripted]) -> None:
    server = serve(whole(BIG))
    reply, body = fetch(broker(server.port, max_response_bytes=len(BIG) - 1).session(), server.port)
    assert body is None and reply["error"]["kind"] == "egress_limit" and reply["error"]["reason"] == "size"


def test_a_body_over_what_is_left_of_the_total_is_refused(serve: Callable[..., Scripted]) -> None:
    server = serve(whole(BIG), whole(BIG))
    session = broker(server.port, max_total_bytes=len(BIG) + len(BIG) // 2).session()
    before = pipes()
    _, first = fetch(session, server.port)
    assert isinstance(first, PipedBody)
    first.close()
    reply, body = fetch(session, server.port)
    assert body is None and reply["error"]["kind"] == "egress_limit", reply
    assert pipes() == before


# --- through a sandbox: the body arrives whole, and a short one leaves the channel's framing intact ----------


class PipingBridge:
    """The agent bridge's way: ``handle_request(..., piped=True)`` for the exchange."""

    def __init__(self, broker: EgressBroker) -> None:
        self.broker = broker
        self.session: Any = None
        self.piped: list[PipedBody] = []

    def __call__(self, call: CallFrame) -> BridgeReply:
        return no_bridge(call)

    def egress_request(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[dict[str, Any], bytes | PipedBody | None]:
        if self.session is None:
            self.session = self.broker.session(deadline=deadline)
        reply: tuple[dict[str, Any], bytes | PipedBody | None] = self.session.handle_request(request, piped=True)
        if isinstance(reply[1], PipedBody):
            self.piped.append(reply[1])
        return reply


PROGRAM = """
import hashlib
out = []
for url in args:
    try:
        out.append(hashlib.sha256(fetch(url).content).hexdigest())
    except NetworkError as e:
        out.append(e.kind)
return out
"""


def test_through_a_sandbox_piped_bodies_arrive_whole_around_a_short_one(
    sandbox: Sandbox, serve: Callable[..., Scripted]
) -> None:
    servers = [serve(whole(BIG)), serve(short), serve(whole(BIG[::-1]))]
    section = EgressSection.model_validate(
        {
            "allow": [{"url": f"http://piped.test:{server.port}/**"} for server in servers],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"piped.test": "127.0.0.1"},
        }
    )
    bridge = PipingBridge(EgressBroker(EgressPolicy().merge(section)))
    request = ExecutionRequest(
        code=PROGRAM, args=[f"http://piped.test:{server.port}/x" for server in servers],
        limits=Limits(timeout_s=20, memory_mb=256, disk_mb=4),
    )  # fmt: skip
    out = sandbox.execute(request, bridge=bridge)
    assert out.ok, (out.error_type, out.error_message, out.stderr[-2000:])
    digest = hashlib.sha256
    assert out.value == [digest(BIG).hexdigest(), "network_error", digest(BIG[::-1]).hexdigest()], out.value
    assert len(bridge.piped) == 2 and all(body.fd == -1 for body in bridge.piped)  # sent (or read) and closed


def test_the_agents_bridge_takes_the_pipe(serve: Callable[..., Scripted]) -> None:
    """The agent's (and ``sandforge exec``'s) bridge feeds the exchange: it asks for the spliced body."""
    server = serve(whole(BIG))
    bridge = StandaloneBridge(ExecutionEgress(broker(server.port)))
    reply, body = bridge.egress_request({"url": f"http://piped.test:{server.port}/x"}, deadline=time.monotonic() + 10)
    assert reply["error"] is None and isinstance(body, PipedBody) and body.read() == BIG
