"""``notifications/tools/list_changed`` and the audit of MCP calls, through the SDK's own client.

The server declares ``listChanged``; when a call forges a new healthy cacheable tool, when one degrades, when
the HTTP API's agent call forges one, or when another process changes the store, clients hear of it: on a
``subscriptions/listen`` stream (2026-07-28) and as a notification on handshake-era sessions. Over HTTP the
audit log names the MCP tool called (and the role and method behind a persisted one)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import Client
from mcp.client.subscriptions import Subscription
from mcp.shared.subscriptions import ToolsListChanged

from tests.service.mcp.conftest import seed
from tests.service.mcp.test_http import session
from tests.service.mcp.test_stdio import ok
from tests.service.mcp.test_stdio import server as stdio_server
from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow

GREET = "return 'hi ' + args[0]"
WAIT_S = 60.0  # how long a notification may take to arrive before the test fails (never a speed goal)


async def next_change(sub: Subscription) -> object:
    with_timeout = asyncio.wait_for(sub.__anext__(), WAIT_S)
    return await with_timeout


async def names(client: Client) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


class Notes:
    """The handshake-era notifications a client received."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.count = 0

    async def __call__(self, message: Any) -> None:
        root = getattr(message, "root", message)
        if isinstance(root, mcp_types.ToolListChangedNotification):
            self.count += 1
            self.changed.set()

    async def wait(self) -> None:
        await asyncio.wait_for(self.changed.wait(), WAIT_S)
        self.changed.clear()


def _stdio(tenant: Path, root: Path) -> Any:
    programs = root / "programs.json"
    programs.write_text(json.dumps([GREET]))
    return stdio_server(tenant, "--provider", "scripted", "--programs", str(programs))


def test_stdio_listeners_hear_of_a_new_tool_and_a_degraded_one(tenant_a: Path, tmp_path: Path) -> None:
    async def main() -> None:
        async with Client(_stdio(tenant_a, tmp_path)) as client:
            assert client.server_capabilities.tools is not None
            assert client.server_capabilities.tools.list_changed is True
            assert "greeter.hi" not in await names(client)
            async with client.listen(tools_list_changed=True) as sub:
                forged = ok(await client.call_tool("call_stored_tool", {"role": "greeter", "method": "hi",
                                                                        "args": ["bob"]}))  # fmt: skip
                assert forged["value"] == "hi bob"
                assert isinstance(await next_change(sub), ToolsListChanged)
                assert "greeter.hi" in await names(client)
                await client.call_tool("calculator.add", {"args": ["a", 1]})  # 'a' + 1 raises: degraded
                assert isinstance(await next_change(sub), ToolsListChanged)
                assert "calculator.add" not in await names(client)

    asyncio.run(main())


def test_stdio_handshake_sessions_are_notified_of_changes_made_elsewhere(tenant_a: Path, tmp_path: Path) -> None:
    notes = Notes()

    async def main() -> None:
        async with Client(_stdio(tenant_a, tmp_path), mode="legacy", message_handler=notes) as client:
            assert client.server_capabilities.tools is not None
            assert client.server_capabilities.tools.list_changed is True
            assert "clock.tick" not in await names(client)
            # another process (here: this one, through the Python API) forges a tool in the same store
            await asyncio.to_thread(seed, tenant_a, "clock", "tick", "return args[0] + 1", [1])
            await notes.wait()
            assert "clock.tick" in await names(client)

    asyncio.run(main())
    assert notes.count == 1  # one change, one notification (the polls in between found nothing new)


# --- streamable HTTP ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(seeded_state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve-mcp-changes")
    shutil.copytree(seeded_state, root / "alpha")
    (root / "programs.json").write_text(json.dumps([GREET, "return args[0] * 2"]))
    seed(root / "beta", "vault", "secret", "return 'B-secret'", [], purpose="Beta's own secret.")
    config = {
        "state_dir": "state",
        "tenants": [
            {"name": "alpha", "state_dir": "alpha", "provider": {"kind": "scripted", "programs": "programs.json"}},
            {"name": "beta", "state_dir": "beta"},
        ],
    }
    srv = start_server(root, config)
    yield srv
    srv.stop()


def test_http_listeners_hear_of_a_tool_the_http_api_forged(server: Server) -> None:
    async def body(client: Client) -> None:
        assert client.server_capabilities.tools is not None and client.server_capabilities.tools.list_changed
        async with client.listen(tools_list_changed=True) as sub:
            with server.client("alpha") as http:
                answer = await asyncio.to_thread(http.post, "/v1/agents/greeter/hi", json={"args": ["ann"]})
            assert answer.status_code == 200 and answer.json()["value"] == "hi ann", answer.text
            assert isinstance(await next_change(sub), ToolsListChanged)
            assert "greeter.hi" in await names(client)

    session(server, server.tokens["alpha"], body)


def test_http_handshake_sessions_hear_of_a_tool_an_mcp_call_forged(server: Server) -> None:
    notes = Notes()
    beta_notes = Notes()

    async def beta(client: Client) -> None:
        assert await names(client) >= {"vault.secret"}
        await asyncio.sleep(0)

    async def body(client: Client) -> None:
        assert client.server_capabilities.tools is not None and client.server_capabilities.tools.list_changed
        before = await names(client)
        assert "doubler.twice" not in before
        out = ok(await client.call_tool("call_stored_tool", {"role": "doubler", "method": "twice", "args": [21]}))
        assert out["value"] == 42
        await notes.wait()
        assert "doubler.twice" in await names(client)

    session(server, server.tokens["alpha"], body, mode="legacy", message_handler=notes)
    session(server, server.tokens["beta"], beta, mode="legacy", message_handler=beta_notes)
    assert beta_notes.count == 0  # alpha's change is alpha's: beta's clients hear nothing of it


def _audit(server: Server, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The audit record ``match`` picks (the server writes it once the response is sent: wait for it)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        path = server.root / "state" / "audit.jsonl"
        records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        found = [r for r in records if match(r)]
        if found or time.monotonic() > deadline:
            assert found, records[-5:]
            return found[-1]
        time.sleep(0.1)


def test_the_audit_log_names_the_mcp_tool_and_the_method_behind_it(server: Server) -> None:
    async def body(client: Client) -> None:
        assert ok(await client.call_tool("calculator.add", {"args": [2, 3]}))["value"] == 5
        assert ok(await client.call_tool("call_stored_tool", {"role": "shouter", "method": "shout",
                                                              "args": ["hey"]}))["value"] == "HEY!"  # fmt: skip
        assert ok(await client.call_tool("list_tools", {}))

    session(server, server.tokens["alpha"], body)
    persisted = _audit(server, lambda r: r.get("mcp_tool") == "calculator.add")
    assert persisted["tenant"] == "alpha" and persisted["mcp_method"] == "tools/call"
    assert (persisted["tool_role"], persisted["tool_method"]) == ("calculator", "add")
    stored = _audit(server, lambda r: r.get("mcp_tool") == "call_stored_tool")
    assert (stored["tool_role"], stored["tool_method"]) == ("shouter", "shout")
    listing = _audit(server, lambda r: r.get("mcp_tool") == "list_tools")
    assert listing["tool_role"] is None and listing["status"] == 200
    assert _audit(server, lambda r: r.get("mcp_method") == "tools/list")["mcp_tool"] is None
    with server.client("alpha") as http:
        http.post("/v1/agents/shouter/shout", json={"args": ["x"]})
    agent = _audit(server, lambda r: r["path"] == "/v1/agents/shouter/shout")
    assert (agent["tool_role"], agent["tool_method"]) == ("shouter", "shout") and agent["mcp_tool"] is None
    assert all(server.tokens["alpha"] not in json.dumps(r) for r in [persisted, stored, listing, agent])
