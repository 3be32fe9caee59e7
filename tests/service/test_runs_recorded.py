"""Issue 37 item 5: every run is recorded. ``sandforge exec`` (a real process), ``POST /v1/exec`` (the app) and
MCP ``run_tool_code`` (the Python SDK's client) put each run, failed or not, in the call log with its source,
its verdict, protections, lane and security event; the dashboard's calls pages list them; another tenant's
log and dashboard never show them."""

from __future__ import annotations

import asyncio
import html
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mcp import Client

from sandforge.runtime.agent.calllog import CallRecord, read_records
from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.mcp import TenantMCP
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config, standalone_tenant
from sandforge.sandbox import seam
from tests.security_programs import TRIPPING, TRIPWIRE_SEAM
from tests.service.mcp.test_stdio import failure, ok

OK = "return args[0] + 1"
REFUSED = "import os\nreturn 1"  # the policy refuses it: nothing runs
RAISES = "raise ValueError('boom')"


def _records(path: Path) -> list[CallRecord]:
    return list(read_records(path)) if path.exists() else []


def _assert_lanes(records: list[CallRecord], source: str) -> None:
    """The ok run, the refused one (validation lane) and the one that raised (execution lane), in order."""
    assert [r.source for r in records] == [source] * 3
    assert {(r.role, r.method) for r in records} == {("exec", "run")}
    ran, refused, raised = records
    assert ran.status == "ok" and ran.value == 2 and ran.verdict == "approved" and ran.attempt_stage == "executed"
    assert ran.protections and all(ran.protections.values()), ran.protections  # verified before it ran
    assert ran.program_code == OK and ran.args == [1] and ran.attempt_failures == []
    assert refused.status == "error" and refused.error_type == "guardrail_violation" and refused.backend is None
    assert refused.latest_failure_stage == "validation" and refused.validation_failure_type == "forbidden_module"
    assert [(a.stage, a.failure_class) for a in refused.attempt_failures] == [("validation", "recoverable")]
    assert raised.status == "error" and raised.error_type == "execution" and raised.failure_class == "intrinsic"
    assert raised.latest_failure_stage == "execution" and raised.attempt_stage == "rolled_back"
    assert [a.stage for a in raised.attempt_failures] == ["execution"] and raised.protections
    assert len({r.call_id for r in records}) == 3 and len({r.trace_id for r in records}) == 3


# --- sandforge exec ------------------------------------------------------------------------------------


def _exec(tmp_path: Path, code: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "program.py"
    program.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "SANDFORGE_CALL_LOG"}
    env["SANDFORGE_STATE_DIR"] = str(state_dir)
    return subprocess.run(
        [sys.executable, "-m", "sandforge", "exec", str(program), "--backend", "subprocess", "--args", "[1]"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_sandforge_exec_records_every_run_in_the_local_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    codes = [_exec(tmp_path, code, state).returncode for code in (OK, REFUSED, RAISES)]
    assert codes == [0, 3, 1]
    _assert_lanes(_records(state / "logs" / "calls.jsonl"), "cli")
    env = {**os.environ, "SANDFORGE_CALL_LOG": str(state / "logs" / "calls.jsonl")}
    shown = subprocess.run([sys.executable, "-m", "sandforge", "logs"], capture_output=True, text=True, env=env,
                           timeout=60, check=True).stdout  # fmt: skip
    assert "exec.run(1) [cli] -> ok 2" in shown and "exec.run(1) [cli] -> error [guardrail_violation]" in shown


def test_sandforge_exec_without_a_writable_state_dir_says_so_in_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a state directory below a regular file can never be made, even by root
    result = _exec(tmp_path, OK, blocked / "state")
    assert result.returncode == 0 and "ok: 2" in result.stdout  # the run itself is unaffected
    lines = [line for line in result.stderr.splitlines() if "call log" in line]
    assert lines == [f"sandforge exec: this run is not in the call log: cannot write "
                     f"{blocked / 'state' / 'logs' / 'calls.jsonl'}: Not a directory"], result.stderr  # fmt: skip
    assert "Traceback" not in result.stderr


# --- POST /v1/exec and the dashboard -------------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], Path]]:
    tokens = {name: new_token() for name in ("alpha", "beta")}
    tenants = [{"name": n, "token_hashes": [hash_token(t)], "backend": "subprocess"} for n, t in tokens.items()]
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": tenants}, base=tmp_path)
    app = create_app(config, audit=AuditLog(tmp_path / "audit.jsonl"))
    with TestClient(app.state.gate, base_url="https://testserver") as client:
        yield client, tokens, tmp_path / "state"


def _page(client: TestClient, token: str, path: str) -> str:
    client.cookies.clear()
    assert client.post("/dashboard/login", data={"token": token}, follow_redirects=False).status_code == 303
    response = client.get(path)
    assert response.status_code == 200, response.text
    return html.unescape(response.text)


def test_post_v1_exec_records_every_run_and_the_dashboard_lists_them(
    site: tuple[TestClient, dict[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, tokens, state = site
    bearer = {"Authorization": f"Bearer {tokens['alpha']}"}
    for code in (OK, REFUSED, RAISES):
        assert client.post("/v1/exec", json={"code": code, "args": [1]}, headers=bearer).status_code == 200
    monkeypatch.setattr(seam, "ACTIVE", TRIPWIRE_SEAM)  # issue 36 item 1's fix reverted: a security event ends it
    answer = client.post("/v1/exec", json={"code": TRIPPING}, headers=bearer).json()
    assert answer["error_type"] == "sandbox_violation" and answer["security_event"] is not None
    records = _records(state / "tenants" / "alpha" / "logs" / "calls.jsonl")
    _assert_lanes(records[:3], "http")
    tripped = records[3]
    assert tripped.source == "http" and tripped.error_type == "sandbox_violation"
    seen = answer["security_event"]
    assert [(e.source, e.event) for e in tripped.security_events] == [(seen["source"], seen["event"])]
    assert tripped.attempt_failures[0].security_event is not None

    listed = _page(client, tokens["alpha"], "/dashboard/calls")
    assert listed.count('<td class="source"><span class="tag src-http">http</span></td>') == 4
    assert listed.count(">exec.run</a>") == 4 and "guardrail_violation" in listed and "validation" in listed
    assert _page(client, tokens["alpha"], "/dashboard/calls?source=agent").count(">exec.run</a>") == 0
    assert _page(client, tokens["alpha"], "/dashboard/calls?source=http").count(">exec.run</a>") == 4
    one = _page(client, tokens["alpha"], f"/dashboard/calls/{records[0].call_id}")
    assert '<span class="tag" id="call-source">http</span>' in one and "seccomp" in one
    security = _page(client, tokens["alpha"], "/dashboard/security")
    assert "exec.run" in security and seen["event"] in security
    # beta: nothing of alpha's runs in its log, its calls page or its security page
    assert _records(state / "tenants" / "beta" / "logs" / "calls.jsonl") == []
    assert "exec.run" not in _page(client, tokens["beta"], "/dashboard/calls")
    assert "exec.run" not in _page(client, tokens["beta"], "/dashboard/security")
    client.cookies.clear()
    assert client.post("/dashboard/login", data={"token": tokens["beta"]}, follow_redirects=False).status_code == 303
    assert client.get(f"/dashboard/calls/{records[0].call_id}").status_code == 404


# --- MCP run_tool_code ---------------------------------------------------------------------------------


def test_mcp_run_tool_code_records_every_run(tmp_path: Path) -> None:
    runtime = standalone_tenant("a", tmp_path / "state", backend="subprocess")
    answers: list[dict[str, Any]] = []

    async def main() -> None:
        async with Client(TenantMCP(runtime)) as client:
            answers.append(ok(await client.call_tool("run_tool_code", {"code": OK, "args": [1]})))
            for code in (REFUSED, RAISES):
                answers.append(failure(await client.call_tool("run_tool_code", {"code": code, "args": [1]})))

    try:
        asyncio.run(main())
    finally:
        runtime.close()
    assert [a.get("value", a.get("error_type")) for a in answers] == [2, "guardrail_violation", "execution"]
    _assert_lanes(_records(tmp_path / "state" / "logs" / "calls.jsonl"), "mcp")


def test_runs_that_fail_for_the_caller_are_extrinsic(site: tuple[TestClient, dict[str, str], Path]) -> None:
    """A refusal only the caller's grants make, and a timeout the host enforced: the world's or the caller's,
    never the program's (the agent's rules, ADR 0012), each in its lane."""
    client, tokens, state = site
    bearer = {"Authorization": f"Bearer {tokens['alpha']}"}
    ungranted = "return fetch('http://127.0.0.1:9/').status"  # the default policy grants no http_fetch
    for body in ({"code": ungranted}, {"code": "while True:\n    pass", "timeout_s": 0.5}):
        assert client.post("/v1/exec", json=body, headers=bearer).json()["status"] == "error"
    refused, timed_out = _records(state / "tenants" / "alpha" / "logs" / "calls.jsonl")
    assert (refused.error_type, refused.failure_class, refused.latest_failure_stage) == (
        "guardrail_violation", "extrinsic", "validation"
    )  # fmt: skip
    assert refused.validation_failure_type == "capability_not_granted" and refused.attempt_stage == "generated"
    assert [c.tag for c in refused.capabilities] == ["http_fetch"] and refused.capabilities[0].granted is False
    assert (timed_out.error_type, timed_out.failure_class, timed_out.latest_failure_stage) == (
        "timeout", "extrinsic", "execution"
    )  # fmt: skip
    assert timed_out.retriable and timed_out.attempt_failures[0].failure_class == "extrinsic"
