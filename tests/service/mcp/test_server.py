"""TenantMCP in-process through the SDK's client: annotations follow the policy, only healthy methods are
exposed, and names MCP would not accept are mapped to ones it does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import Client
from mcp.server.subscriptions import InMemorySubscriptionBus

from sandforge.runtime.service.mcp import TenantMCP
from sandforge.runtime.service.mcp.changes import ToolListWatch
from sandforge.runtime.service.mcp.persisted import MCP_NAME
from sandforge.runtime.service.tenants import TenantRuntime, standalone_tenant
from tests.service.mcp.conftest import ADD, seed
from tests.service.mcp.test_stdio import READ_ONLY, failure, ok


def run(runtime: TenantRuntime, body: Callable[[Client], Awaitable[None]]) -> None:

    async def main() -> None:
        async with Client(TenantMCP(runtime)) as client:
            await body(client)

    try:
        asyncio.run(main())
    finally:
        runtime.close()


def test_tools_are_open_world_only_when_the_policy_grants_egress(tenant_a: Path, tmp_path: Path) -> None:
    layer = tmp_path / "egress"
    layer.mkdir()
    (layer / "egress.yaml").write_text("grant: [http_fetch]\negress:\n  allow:\n    - url: 'https://example.com/**'\n")
    seen: dict[str, dict[str, bool | None]] = {}

    async def body(client: Client) -> None:
        for tool in (await client.list_tools()).tools:
            assert tool.annotations is not None
            seen[tool.name] = {"open": tool.annotations.open_world_hint, "ro": tool.annotations.read_only_hint}

    run(standalone_tenant("a", tenant_a, policy=(layer,), backend="subprocess"), body)
    for name in ("run_tool_code", "call_stored_tool", "calculator.add", "shouter.shout"):
        assert seen[name] == {"open": True, "ro": False}, name
    for name in READ_ONLY:
        assert seen[name] == {"open": False, "ro": True}, name


def test_a_method_that_turns_unhealthy_is_no_longer_a_tool(tenant_a: Path) -> None:
    async def body(client: Client) -> None:
        assert "calculator.add" in {t.name for t in (await client.list_tools()).tools}
        broken = failure(await client.call_tool("calculator.add", {"args": ["a", 1]}))  # 'a' + 1 raises
        assert broken["error_type"] in {"execution", "provider"}
        assert "calculator.add" not in {t.name for t in (await client.list_tools()).tools}
        assert failure(await client.call_tool("calculator.add", {"args": [1, 2]}))["error_type"] == "unknown_tool"
        # still reachable through the lifecycle, which decides itself whether to reuse or regenerate
        detail = ok(await client.call_tool("get_tool", {"role": "calculator"}))
        assert detail["methods"][0]["health"] != "healthy" and detail["methods"][0]["mcp_tool"] is None

    run(standalone_tenant("a", tenant_a, backend="subprocess"), body)


def test_a_name_mcp_would_refuse_is_mapped_to_one_it_accepts(tmp_path: Path) -> None:
    role, method = "r" * 64, "m" * 64  # role.method is 129 characters: over MCP's 128
    seed(tmp_path, role, method, ADD, [1, 2])

    async def body(client: Client) -> None:
        mapped = [t for t in (await client.list_tools()).tools if t.title == f"{role}.{method}"]
        assert len(mapped) == 1 and MCP_NAME.fullmatch(mapped[0].name) and len(mapped[0].name) <= 128
        assert ok(await client.call_tool(mapped[0].name, {"args": [2, 3]}))["value"] == 5

    run(standalone_tenant("a", tmp_path, backend="subprocess"), body)


def test_the_tool_list_watch_reads_the_store_only_once_a_client_uses_the_server() -> None:
    """Nothing reads the store while a host waits for the ``initialize`` answer (issue 37)."""
    reads: list[int] = []

    def signature() -> frozenset[tuple[str, ...]]:
        reads.append(1)
        return frozenset()

    async def main() -> None:
        watch = ToolListWatch(signature, InMemorySubscriptionBus(), poll_s=3600)
        async with anyio.create_task_group() as group:
            group.start_soon(watch.watch)
            for _ in range(100):
                await anyio.sleep(0)
            assert reads == []
            watch.used()  # what the server's middleware calls for any message past the handshake
            with anyio.fail_after(60):
                while not reads:
                    await anyio.sleep(0.01)
            group.cancel_scope.cancel()

    anyio.run(main)
