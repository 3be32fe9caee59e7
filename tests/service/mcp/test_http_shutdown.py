"""A real `sandforge serve` stops cleanly after `/mcp` was used: exit status 0, the app's shutdown complete
(tenants closed), and no traceback in its output, whether the MCP client is gone or still connected."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow


def _use_mcp(server: Server, mode: str, *, stop_while_connected: bool) -> None:
    """List the tools over streamable HTTP; with ``stop_while_connected``, signal the server from inside the
    session and wait for it to exit before the client leaves."""

    async def main() -> None:
        headers = {"Authorization": f"Bearer {server.tokens['t']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http,
            Client(streamable_http_client(f"{server.url}/mcp", http_client=http), mode=mode) as client,
        ):
            assert "run_tool_code" in {t.name for t in (await client.list_tools()).tools}
            if stop_while_connected:
                server.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 60
                while server.proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)

    try:
        asyncio.run(main())
    except BaseException:  # the session's own goodbye may find the server gone; the server's output is the test
        if not stop_while_connected:
            raise


@pytest.mark.parametrize(
    ("sig", "mode", "connected"),
    [(signal.SIGTERM, "auto", False), (signal.SIGINT, "legacy", False), (signal.SIGTERM, "legacy", True)],
    ids=["sigterm-modern", "sigint-handshake", "sigterm-client-still-connected"],
)
def test_serve_stops_without_a_traceback_after_mcp_was_used(
    tmp_path: Path, sig: signal.Signals, mode: str, connected: bool
) -> None:
    server = start_server(tmp_path, {"state_dir": "state", "shutdown_grace_s": 2, "tenants": [{"name": "t"}]})
    try:
        _use_mcp(server, mode, stop_while_connected=connected)
    finally:
        status = server.stop(sig)
    output = server.log()
    assert status == 0, output
    assert "Traceback" not in output and "ERROR" not in output, output
    assert "Application shutdown complete" in output, output  # the lifespan ran to its end: tenants closed
