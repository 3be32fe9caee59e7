"""Issue 37 item 5: a run's fetches are in its call-log record, as an agent call's are (issue 18): ``sandforge
exec``, ``POST /v1/exec`` and MCP ``run_tool_code`` broker them under the policy and record each request's
provenance (method, URL, status, the allow rule that matched), against loopback servers in a network namespace
with only lo up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from mcp import Client

from sandforge.runtime.agent.calllog import CallRecord, read_records
from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.mcp import TenantMCP
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config, standalone_tenant
from tests.egress.conftest import Net
from tests.egress.test_agent_egress import layer, program
from tests.service.mcp.test_stdio import ok

pytestmark = pytest.mark.netns


def _fetched(record: CallRecord, source: str, port: int) -> None:
    assert record.source == source and record.status == "ok", record
    assert record.egress_requests == 1
    [request] = record.egress
    assert (request.method, request.url, request.status) == ("GET", f"http://allowed.test:{port}/hello", 200)
    assert (request.rule or "").startswith("loopback"), request.rule  # the allow entry that matched


def test_every_runs_fetches_are_in_its_record(tmp_path: Path, net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandforge.runtime.cli import main as cli

    layer(tmp_path, net)  # tmp_path/policy: grants http_fetch, allows allowed.test on the server's port
    code = program(f"http://allowed.test:{net.port}/hello")
    source = tmp_path / "prog.py"
    source.write_text(code)
    cli_log = tmp_path / "cli.jsonl"
    monkeypatch.setenv("SANDFORGE_CALL_LOG", str(cli_log))
    result = CliRunner().invoke(cli, ["exec", str(source), "--backend", "subprocess", "--policy",
                                      str(tmp_path / "policy")])  # fmt: skip
    assert result.exit_code == 0, result.output
    _fetched(next(read_records(cli_log)), "cli", net.port)

    token = new_token()
    tenant = {"name": "t", "token_hashes": [hash_token(token)], "backend": "subprocess",
              "policy": [str(tmp_path / "policy")]}  # fmt: skip
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": [tenant]}, base=tmp_path)
    app = create_app(config, audit=AuditLog(tmp_path / "audit.jsonl"))
    with TestClient(app.state.gate, base_url="https://testserver") as client:
        answer = client.post("/v1/exec", json={"code": code}, headers={"Authorization": f"Bearer {token}"})
        assert answer.json()["status"] == "ok", answer.text
    _fetched(next(read_records(tmp_path / "state" / "tenants" / "t" / "logs" / "calls.jsonl")), "http", net.port)

    runtime = standalone_tenant("m", tmp_path / "mcp", policy=(tmp_path / "policy",), backend="subprocess")

    async def main() -> None:
        async with Client(TenantMCP(runtime)) as mcp:
            assert ok(await mcp.call_tool("run_tool_code", {"code": code}))["value"]["status"] == 200

    try:
        asyncio.run(main())
    finally:
        runtime.close()
    _fetched(next(read_records(tmp_path / "mcp" / "logs" / "calls.jsonl")), "mcp", net.port)
    assert len(net.allowed.seen) == 3 and net.nothing_reached_forbidden()
