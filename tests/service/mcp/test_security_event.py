"""Issue 36: an MCP ``run_tool_code`` run that ends on a security event (the inner wall's, the tripwire's) says
so, in its data and its text, with no traceback in the result or the server's log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mcp import Client

from sandforge.runtime.service.tenants import standalone_tenant
from sandforge.sandbox import seam
from tests.security_programs import EVENT, SOURCE, TRIP_EVENT, TRIP_SOURCE, TRIPPING, TRIPWIRE_SEAM, VIOLATING
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


def test_run_tool_code_that_trips_is_a_typed_error_without_traceback(
    tenant_a: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(seam, "ACTIVE", TRIPWIRE_SEAM)  # issue 36 item 1's fix reverted: the tripwire ends it

    async def body(client: Client) -> None:
        result = await client.call_tool("run_tool_code", {"code": TRIPPING})
        data = failure(result)
        assert data["error_type"] == "sandbox_violation"
        event = data["details"]["security_event"]
        assert (event["source"], event["event"]) == (TRIP_SOURCE, TRIP_EVENT)
        text = result.content[0].text  # type: ignore[union-attr]
        assert f"security event: {TRIP_SOURCE} {TRIP_EVENT}" in text and "Traceback" not in text

    with caplog.at_level(logging.DEBUG):
        run(standalone_tenant("a", tenant_a, backend="subprocess"), body)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
