"""Issue 36: an MCP ``run_tool_code`` run that ends on a security event says so, in its data and its text."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from sandforge.runtime.service.tenants import standalone_tenant
from tests.security_programs import EVENT, SOURCE, VIOLATING
from tests.service.mcp.test_server import run
from tests.service.mcp.test_stdio import failure


def test_run_tool_code_reports_the_security_event(tenant_a: Path) -> None:
    async def body(client: Client) -> None:
        result = await client.call_tool("run_tool_code", {"code": VIOLATING})
        data = failure(result)
        assert data["error_type"] == "sandbox_violation"
        event = data["details"]["security_event"]
        assert (event["source"], event["event"]) == (SOURCE, EVENT)
        assert f"security event: {SOURCE} {EVENT}" in result.content[0].text  # type: ignore[union-attr]
        plain = failure(await client.call_tool("run_tool_code", {"code": "raise ValueError('x')"}))
        assert "security_event" not in plain["details"]

    run(standalone_tenant("a", tenant_a, backend="subprocess"), body)
