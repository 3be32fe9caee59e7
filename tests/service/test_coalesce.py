"""The coalescing transport under ``sandforge serve``: one socket write per response, nothing held back.

The transport is a real asyncio socket transport (a socket pair); its ``write`` is spied on, not replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from sandforge.runtime.service.coalesce import CoalescingHttpProtocol, CoalescingTransport
from tests.service.serverproc import free_port


async def _pair() -> tuple[asyncio.Transport, socket.socket, list[bytes]]:
    """A real transport on one end of a socket pair, the raw other end, and the writes the transport got."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    writes: list[bytes] = []
    real_write = transport.write

    def spy(data: Any) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = spy  # type: ignore[method-assign]
    theirs.setblocking(False)
    return transport, theirs, writes  # type: ignore[return-value]


async def _read_all(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    while len(got) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
        if not chunk:
            break
        got += chunk
    return got


def test_writes_of_one_iteration_reach_the_socket_as_one() -> None:
    asyncio.run(_test_writes_of_one_iteration_reach_the_socket_as_one())


async def _test_writes_of_one_iteration_reach_the_socket_as_one() -> None:
    transport, peer, writes = await _pair()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
    wrapped.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    wrapped.write(b"{}")
    assert writes == []  # held until the end of this iteration, not longer
    assert wrapped.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    assert await _read_all(peer, 40) == writes[0]
    wrapped.write(b"next")  # a later iteration: its own write, delivered without waiting for more
    await asyncio.sleep(0)
    assert writes[1:] == [b"next"]
    transport.close()
    peer.close()


def test_close_sends_what_was_written_first_and_abort_drops_it() -> None:
    asyncio.run(_test_close_sends_what_was_written_first_and_abort_drops_it())


async def _test_close_sends_what_was_written_first_and_abort_drops_it() -> None:
    transport, peer, writes = await _pair()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
    wrapped.write(b"last answer")
    wrapped.close()
    assert writes == [b"last answer"]
    assert await _read_all(peer, 100) == b"last answer"  # then end of stream
    peer.close()

    transport, peer, writes = await _pair()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
    wrapped.write(b"never")
    wrapped.abort()
    await asyncio.sleep(0)
    assert writes == []
    assert await _read_all(peer, 100) == b""
    peer.close()


def test_a_write_after_the_peer_closed_is_dropped_quietly() -> None:
    asyncio.run(_test_a_write_after_the_peer_closed_is_dropped_quietly())


async def _test_a_write_after_the_peer_closed_is_dropped_quietly() -> None:
    transport, peer, writes = await _pair()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
    wrapped.write(b"late")
    transport.close()
    await asyncio.sleep(0)
    assert writes == []
    peer.close()


FIRST_PART_READ = asyncio.Event()


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":  # a streamed response: each part must leave when sent, not at the end
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"one\n", "more_body": True})
        await asyncio.wait_for(FIRST_PART_READ.wait(), 5)  # held back, the client would never see it: timeout
        await send({"type": "http.response.body", "body": b"two\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok": true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=CoalescingHttpProtocol, log_level="warning",
                            lifespan="off")  # fmt: skip
    srv = uvicorn.Server(config)
    task = asyncio.create_task(srv.serve())
    while not srv.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        await task


def test_uvicorn_answers_through_it_kept_alive_streamed_and_closed() -> None:
    async def scenario() -> None:
        async with _server() as url, httpx.AsyncClient(base_url=url) as client:
            for _ in range(3):  # keep-alive: several answers on one connection
                r = await client.get("/")
                assert r.status_code == 200 and r.json() == {"ok": True}
            r = await client.get("/", headers={"connection": "close"})
            assert r.json() == {"ok": True}
            async with client.stream("GET", "/stream") as streamed:
                lines = streamed.aiter_lines()
                assert await anext(lines) == "one"
                FIRST_PART_READ.set()
                assert [line async for line in lines] == ["two"]

    asyncio.run(scenario())
