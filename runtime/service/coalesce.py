"""One socket write per response: uvicorn's HTTP protocol with writes coalesced per event-loop iteration.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body on
``http.response.body``: two ``send()`` calls for every small JSON answer. On loopback each one wakes the
client, which reads the head, finds no body yet and sleeps again, so a call pays two wake-ups and a context
switch on both sides (the largest single cost of ``POST /v1/exec``'s HTTP overhead in a py-spy profile of the
server). Here the transport's writes are gathered and handed to the socket once, at the end of the loop
iteration that made them: a whole response goes out in one segment, and a streamed one (MCP's event
streams) still leaves within the same iteration, so nothing waits longer than it did. A response that is
complete leaves at once (uvicorn's ``on_response`` hook): what the app still does after its last ``send`` in
the same step (the gatekeeper's audit record) no longer holds the answer back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandforge.runtime.service.gate import DISCONNECTED, REQUEST_TASK


class CoalescingTransport:
    """Proxies a transport; ``write`` buffers until the end of the current loop iteration."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()  # a response then ``Connection: close``: the response first
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(p) for p in self._pending)

    def __getattr__(self, name: str) -> Any:  # everything else (extra info, pausing reads) is the transport's own
        return getattr(self._transport, name)


class CoalescingHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a :class:`CoalescingTransport`. A request whose client goes
    away before its answer started is cancelled if the gatekeeper registered its task (``POST /v1/exec``: its
    awaited execution then ends as a timeout would, instead of running to its limit for nobody)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        """The response's last bytes were written: to the socket now, not at the end of the iteration (the app's
        own work after its last ``send``, such as the audit write, then runs after the client has its answer)."""
        transport = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is None or cycle.response_started:
            return
        state = cycle.scope.get("state")
        task = state.get(REQUEST_TASK) if isinstance(state, dict) else None
        if isinstance(task, asyncio.Task) and not task.done():
            state[DISCONNECTED] = True  # type: ignore[index]
            task.cancel()
