"""The direct channel to a node's sandbox host (round 8), attacked in-process: only a peer with the host's secret
is answered, nothing is unpickled, every message is bounded, a silent or malformed peer costs one connection
and nothing else, and a lost or late host is a typed ChannelError the executor maps to ``sandbox_unavailable``."""

from __future__ import annotations

import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sandforge.sandbox import ExecutionRequest
from sandforge.sandbox.cluster import channel as channel_mod
from sandforge.sandbox.cluster.channel import Channel, ChannelError, ChannelServer, encode, read_message
from sandforge.sandbox.cluster.host import SandboxHost
from sandforge.sandbox.cluster.wire import outcome_from_wire, request_to_wire
from sandforge.sandbox.context import ContextSnapshot


def call(request: ExecutionRequest, exec_id: str, kinds: list[str] | None = None) -> dict[str, Any]:
    message, blobs = request_to_wire(request)
    return {"id": exec_id, "message": message, "backend": "subprocess", "blobs": blobs, "kinds": kinds}


def connected(host: SandboxHost) -> Channel:
    info = host.channel()
    return Channel((info["host"], info["port"]), info["secret"])


def raw(host: SandboxHost) -> socket.socket:
    info = host.channel()
    return socket.create_connection((info["host"], info["port"]), timeout=10)


def closed_without_answer(sock: socket.socket) -> bool:
    """The peer closed this connection and sent nothing (reset counts as closed)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_an_execution_runs_over_the_channel_with_its_context(host: SandboxHost) -> None:
    channel = connected(host)
    request = ExecutionRequest(
        code="context['n'] += 1\nreturn context['blob'][:3]", context={"n": 1, "blob": "x" * 9000}
    )
    event = channel.call({"op": "start", "args": [call(request, "ch1")]}, 30)
    outcome = outcome_from_wire(event, ContextSnapshot.coerce(request.context))
    assert outcome.ok, outcome.error_message
    assert outcome.value == "xxx" and outcome.context["n"] == 2
    channel.close()


def test_frames_are_parked_and_answered_over_the_channel(host: SandboxHost) -> None:
    channel = connected(host)
    request = ExecutionRequest(code="r = tool('t').go(2)\nreturn [r.ok, r.value]")
    event = channel.call({"op": "start", "args": [call(request, "ch2", ["call"])]}, 30)
    assert event["kind"] == "call" and event["frame"]["args"] == [2]
    event = channel.call({"op": "step", "args": ["ch2", {"status": "ok", "value": 5}]}, 30)
    assert outcome_from_wire(event, ContextSnapshot()).value == [True, 5]
    assert channel.call({"op": "ping"}, 5)["kind"] == "pong"
    channel.close()


def test_a_peer_without_the_secret_gets_no_answer_and_runs_nothing(host: SandboxHost) -> None:
    before = host.status()["executed"]
    info = host.channel()
    forged = Channel((info["host"], info["port"]), b"\x00" * 32)
    with pytest.raises(ChannelError, match="refused"):
        forged.call({"op": "start", "args": [call(ExecutionRequest(code="return 1"), "ch3")]}, 10)
    sock = raw(host)  # no hello at all: the first message must be the secret
    sock.sendall(encode({"op": "start", "args": [call(ExecutionRequest(code="return 1"), "ch4")]}))
    assert closed_without_answer(sock)
    assert host.status()["executed"] == before


def test_nothing_is_unpickled(host: SandboxHost, tmp_path: Path) -> None:
    """A pickle that would create a file when loaded, before and after authenticating: neither is loaded."""
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Bomb())
    sock = raw(host)
    sock.sendall(struct.pack(">I", len(payload)) + payload)
    assert closed_without_answer(sock)
    channel = connected(host)
    sock = channel.connect()  # authenticated
    sock.sendall(struct.pack(">I", len(payload)) + payload)
    assert closed_without_answer(sock)
    assert not marker.exists()
    assert channel.call({"op": "ping"}, 5)["kind"] == "pong"  # the host still serves everyone else


def test_an_oversized_hello_is_refused_before_it_is_read(host: SandboxHost) -> None:
    sock = raw(host)
    sock.sendall(struct.pack(">I", 64 * 1024 * 1024) + b"x" * 1024)  # announces 64 MiB, sends 1 KiB
    assert closed_without_answer(sock)


def test_a_message_over_the_limit_is_refused_at_both_ends(host: SandboxHost, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = connected(host)
    monkeypatch.setattr(channel_mod, "MAX_MESSAGE_BYTES", 1024)
    with pytest.raises(ChannelError, match="exceeds"):
        encode({"blob": b"x" * 2048})
    sock = channel.connect()
    sock.sendall(struct.pack(">I", 600 * 1024 * 1024))  # over the host's bound (read at its import): no read
    assert closed_without_answer(sock)


def test_a_silent_peer_is_dropped_after_the_hello_window(host: SandboxHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_mod, "HELLO_S", 0.3)
    sock = raw(host)  # connects, never speaks
    t = time.monotonic()
    assert closed_without_answer(sock)
    assert time.monotonic() - t < 8


@pytest.mark.parametrize(
    "message",
    [
        {"op": "start", "args": []},
        {"op": "step", "args": [1, 2]},
        {"op": "exec", "args": ["x"]},
        {"args": "x"},
        {"op": "start", "args": [{"id": "ch5"}]},
    ],
)
def test_a_malformed_message_is_a_typed_failure(host: SandboxHost, message: dict[str, Any]) -> None:
    channel = connected(host)
    event = channel.call(message, 10)
    assert event["kind"] == "done"
    assert event["outcome"]["error_type"] == "invalid_request"
    assert channel.call({"op": "ping"}, 5)["kind"] == "pong"  # the same connection goes on
    channel.close()


def test_garbage_after_authenticating_ends_that_connection_only(host: SandboxHost) -> None:
    channel = connected(host)
    sock = channel.connect()
    sock.sendall(struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    assert closed_without_answer(sock)
    sock = channel.connect()
    body = msgpack.packb([1, 2, 3])  # valid msgpack, not a map
    sock.sendall(struct.pack(">I", len(body)) + body)
    assert closed_without_answer(sock)
    assert channel.call({"op": "ping"}, 5)["kind"] == "pong"


def _server(handle: Any) -> tuple[ChannelServer, Channel]:
    server = ChannelServer(handle)
    return server, Channel(server.address, server.secret)


def test_a_late_answer_is_a_timeout_and_a_lost_host_is_not() -> None:
    release = threading.Event()

    def slow(message: dict[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return {"kind": "done"}

    server, channel = _server(slow)
    try:
        with pytest.raises(ChannelError) as late:
            channel.call({"op": "x"}, 0.3)
        assert late.value.timeout
        release.set()
    finally:
        server.close()
    server2, channel2 = _server(lambda m: {"kind": "pong"})
    assert channel2.call({"op": "ping"}, 5)["kind"] == "pong"  # an idle connection is now pooled
    server2.close()
    with pytest.raises(ChannelError) as lost:  # the listener is gone: a new connection is refused
        Channel(server2.address, server2.secret).call({"op": "ping"}, 5)
    assert not lost.value.timeout


DYING_HOST = """
import os, sys, time
from sandforge.sandbox.cluster.channel import ChannelServer
server = ChannelServer(lambda message: os._exit(1))  # the host process dies while it serves a call
print(server.address[1], server.secret.hex(), flush=True)
time.sleep(60)
"""


def test_a_host_that_dies_mid_call_is_a_lost_node() -> None:
    proc = subprocess.Popen([sys.executable, "-c", DYING_HOST], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port, secret = proc.stdout.readline().split()
        channel = Channel(("127.0.0.1", int(port)), bytes.fromhex(secret))
        with pytest.raises(ChannelError) as lost:
            channel.call({"op": "x"}, 30)
        assert not lost.value.timeout
        assert proc.wait(timeout=30) == 1
    finally:
        proc.kill()
        proc.wait()


def test_a_handler_error_is_reported_not_hung() -> None:
    def broken(message: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "done", "value": object()}  # msgpack cannot carry it

    server, channel = _server(broken)
    try:
        with pytest.raises(ChannelError, match="could not answer"):
            channel.call({"op": "x"}, 10)
    finally:
        server.close()


def test_read_message_rejects_a_truncated_peer() -> None:
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", 100) + b"short")
    a.close()
    with pytest.raises(ChannelError, match="closed"):
        read_message(b)
    b.close()


def test_opening_a_channel_outside_ray_does_not_import_ray() -> None:
    """Ray reads its settings once, on first import (the local cluster's loopback flag among them): a host
    opened in a process before a cluster's settings are in place must not import it (round 8: a later
    connection to the test cluster went to the machine's routable address and hung)."""
    code = (
        "import sys\n"
        "from sandforge.sandbox import SandboxConfig\n"
        "from sandforge.sandbox.cluster.host import SandboxHost\n"
        "h = SandboxHost(SandboxConfig(pool_size=0).model_dump(mode='json'), [])\n"
        "info = h.channel()\n"
        "h.close()\n"
        "print(info['host'], 'ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["127.0.0.1", "False"]


def test_a_host_that_cannot_listen_offers_no_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller then drives it through Ray's actor calls (an empty answer: no address to try)."""
    from sandforge.sandbox import SandboxConfig
    from sandforge.sandbox.cluster import host as host_mod

    def refuse(*args: Any, **kwargs: Any) -> ChannelServer:
        raise OSError("no port (test)")

    monkeypatch.setattr(host_mod, "ChannelServer", refuse)
    h = SandboxHost(SandboxConfig(pool_size=0).model_dump(mode="json"), [])
    try:
        assert h.channel() == {}
    finally:
        h.close()


def test_files_cross_the_cluster_wire_as_bytes() -> None:
    """A request's input files and an ok outcome's output files (issue 41) travel between the caller and a
    node unchanged, as bytes (not base64)."""
    from sandforge.sandbox import ExecutionOutcome
    from sandforge.sandbox.cluster.wire import outcome_to_wire, request_from_wire

    request = ExecutionRequest(code="return 1", files={"data.bin": bytes(range(256))})
    message, _ = request_to_wire(request)
    assert message["files"] == {"data.bin": bytes(range(256))}
    again = request_from_wire(message, {})
    assert isinstance(again, ExecutionRequest) and again.files == request.files
    outcome = ExecutionOutcome.succeeded(1, ContextSnapshot(), files={"out.png": b"\x89PNG"})
    back = outcome_from_wire(outcome_to_wire(outcome, ContextSnapshot()), ContextSnapshot())
    assert back.files == {"out.png": b"\x89PNG"}
