"""``/mcp`` on a real `sandforge serve` process (loopback), driven by the MCP SDK's own client over
streamable HTTP: bearer tokens pick the tenant, and no tenant sees or reaches another's tools or sessions."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.service.mcp.conftest import seed
from tests.service.mcp.test_stdio import FIXED, failure, ok
from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow

INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}  # fmt: skip
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(seeded_state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve-mcp")
    shutil.copytree(seeded_state, root / "alpha")
    seed(root / "beta", "vault", "secret", "return 'B-secret'", [], purpose="Beta's own secret.")
    config = {
        "state_dir": "state",
        "tenants": [
            {"name": "alpha", "state_dir": "alpha"},
            {"name": "beta", "state_dir": "beta"},
            {"name": "gamma", "quotas": {"executions_per_minute": 1}},
        ],
    }
    srv = start_server(root, config)
    yield srv
    srv.stop()


def session(server: Server, token: str, body: Callable[[Client], Awaitable[None]], **client: Any) -> None:
    async def main() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=300.0)) as http:
            transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
            async with Client(transport, **client) as mcp:
                await body(mcp)

    asyncio.run(main())


def test_a_tenant_sees_and_calls_its_own_tools(server: Server) -> None:
    async def body(client: Client) -> None:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == FIXED | {"calculator.add", "shouter.shout"}
        assert ok(await client.call_tool("calculator.add", {"args": [20, 22]}))["value"] == 42
        assert ok(await client.call_tool("run_tool_code", {"code": "return sum(args)", "args": [1, 2]}))["value"] == 3
        refused = failure(await client.call_tool("run_tool_code", {"code": "import socket\nreturn 1"}))
        assert refused["error_type"] == "guardrail_violation"
        over = failure(await client.call_tool("run_tool_code", {"code": "return 1", "timeout_s": 999}))
        assert over["error_type"] == "limit_exceeded"  # above alpha's max_timeout_s quota
        listed = ok(await client.call_tool("list_tools", {}))
        assert {t["role"] for t in listed["tools"]} == {"calculator", "shouter"}

    session(server, server.tokens["alpha"], body)


def test_another_tenants_token_sees_none_of_its_tools(server: Server) -> None:
    async def body(client: Client) -> None:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == FIXED | {"vault.secret"}
        assert failure(await client.call_tool("calculator.add", {"args": [1, 2]}))["error_type"] == "unknown_tool"
        assert failure(await client.call_tool("get_tool", {"role": "calculator"}))["error_type"] == "tool_not_found"
        listed = ok(await client.call_tool("list_tools", {}))
        assert {t["role"] for t in listed["tools"]} == {"vault"}
        # through the lifecycle: beta has no calculator and no provider, so nothing of alpha's runs
        through = failure(await client.call_tool("call_stored_tool", {"role": "calculator", "method": "add",
                                                                      "args": [1, 2]}))  # fmt: skip
        assert through["error_type"] == "provider"
        # a program of beta that calls tool("calculator") reaches beta's store only
        # (alpha's would answer 3; beta's store has no calculator and beta no provider: the nested call fails)
        nested = failure(await client.call_tool("run_tool_code", {"code": "return tool('calculator').add(1, 2)"}))
        assert nested["error_type"] != "ok"
        assert ok(await client.call_tool("vault.secret", {}))["value"] == "B-secret"

    session(server, server.tokens["beta"], body)

    async def alpha(client: Client) -> None:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "vault.secret" not in names
        assert failure(await client.call_tool("vault.secret", {}))["error_type"] == "unknown_tool"

    session(server, server.tokens["alpha"], alpha, mode="legacy")  # the initialize handshake and a session too


@pytest.mark.parametrize("token", [None, "sf_wrong", "Bearer-less"])
def test_no_wrong_or_malformed_token_is_401(server: Server, token: str | None) -> None:
    headers = dict(ACCEPT)
    if token == "Bearer-less":
        headers["Authorization"] = server.tokens["alpha"]
    elif token:
        headers["Authorization"] = f"Bearer {token}"
    response = httpx.post(f"{server.url}/mcp", json=INIT, headers=headers, timeout=30)
    assert response.status_code == 401
    assert "calculator" not in response.text and "Traceback" not in response.text


def test_a_session_is_unreachable_with_another_tenants_token(server: Server) -> None:
    alpha = {**ACCEPT, "Authorization": f"Bearer {server.tokens['alpha']}"}
    beta = {**ACCEPT, "Authorization": f"Bearer {server.tokens['beta']}"}
    opened = httpx.post(f"{server.url}/mcp", json=INIT, headers=alpha, timeout=30)
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    version = {"mcp-protocol-version": "2025-06-18", "mcp-session-id": sid}
    stolen = httpx.post(f"{server.url}/mcp", json=listing, headers={**beta, **version}, timeout=30)
    assert stolen.status_code == 404 and "calculator" not in stolen.text
    own = httpx.post(f"{server.url}/mcp", json=listing, headers={**alpha, **version}, timeout=30)
    assert own.status_code == 200 and "calculator.add" in own.text


def test_executions_are_admitted_by_the_tenants_quotas(server: Server) -> None:
    async def body(client: Client) -> None:
        assert ok(await client.call_tool("run_tool_code", {"code": "return 1"}))["value"] == 1
        over = failure(await client.call_tool("run_tool_code", {"code": "return 2"}))
        assert over["error_type"] == "quota_exceeded" and over["retriable"] is True
        assert over["details"]["retry_after_s"] >= 1
        # reading the store is not an execution: still answered
        assert ok(await client.call_tool("list_tools", {}))["tools"] == []

    session(server, server.tokens["gamma"], body)
