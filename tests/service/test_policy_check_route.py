"""POST /v1/policy/check answers `sandforge policy check --json`'s report: declared packages are judged by the
tenant's dependency rules too (and listed), third-party imports left for the environment are named."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config

DECLARED = '# /// script\n# dependencies = ["python-dateutil"]\n# ///\nfrom dateutil import parser\nreturn 1\n'
REFUSED = '# /// script\n# dependencies = ["requests"]\n# ///\nreturn 1\n'


def _check(tmp_path: Path, code: str) -> dict[str, Any]:
    token = new_token()
    config = parse_server_config(
        {"state_dir": str(tmp_path), "tenants": [{"name": "t", "token_hashes": [hash_token(token)]}]}, base=tmp_path
    )
    gate = create_app(config, audit=AuditLog(None)).state.gate

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t",
                                     headers={"Authorization": f"Bearer {token}"}) as client:  # fmt: skip
            return await client.post("/v1/policy/check", json={"code": code})

    response = asyncio.run(post())
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_declared_allowed_package_is_listed(tmp_path: Path) -> None:
    report = _check(tmp_path, DECLARED)
    assert report["verdict"] == "approved", report
    assert report["declared"] == ["python-dateutil"]


def test_a_declared_refused_package_is_a_violation(tmp_path: Path) -> None:
    report = _check(tmp_path, REFUSED)
    assert report["verdict"] != "approved"
    assert report["violations"][0]["violation_type"] == "dependency_policy_violation"


def test_a_plain_program_declares_nothing(tmp_path: Path) -> None:
    report = _check(tmp_path, "return 1")
    assert report["verdict"] == "approved" and report["declared"] == [] and report["pending_imports"] == []
