"""Issue 36: ``POST /v1/exec`` of a program that trips the tripwire answers one typed error with its security
event, and nothing in the answer, the audit record or the server's log is a traceback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from sandforge.sandbox import seam
from tests.security_programs import TRIP_EVENT, TRIP_SOURCE, TRIPPING, TRIPWIRE_SEAM


def test_post_v1_exec_of_a_program_that_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(seam, "ACTIVE", TRIPWIRE_SEAM)  # issue 36 item 1's fix reverted: the tripwire ends it
    token = new_token()
    tenant = {"name": "t", "token_hashes": [hash_token(token)], "backend": "subprocess"}
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": [tenant]}, base=tmp_path)
    audit_path = tmp_path / "audit.jsonl"
    gate = create_app(config, audit=AuditLog(audit_path)).state.gate

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t",
                                     headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:  # fmt: skip
            return await client.post("/v1/exec", json={"code": TRIPPING})

    with caplog.at_level(logging.DEBUG):
        response = asyncio.run(post())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "error" and body["error_type"] == "sandbox_violation", body
    assert (body["security_event"]["source"], body["security_event"]["event"]) == (TRIP_SOURCE, TRIP_EVENT)
    assert "\n" not in body["error_message"] and "Traceback" not in response.text
    assert body["context"] is None
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert "Traceback" not in (audit_path.read_text() if audit_path.exists() else "")
