"""``POST /v1/exec`` with files (issue 41): input files inline as base64, the outputs of an ok run inlined in
the answer with their size, sha256 and media type; a failed run answers none; bad names and bounds are one
422."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import httpx

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config

PROGRAM = """
with open("inputs/data.csv") as f:
    n = len(f.read().splitlines())
with open("outputs/count.txt", "w") as f:
    f.write(str(n))
with open("outputs/chart.png", "wb") as f:
    f.write(b"\\x89PNG\\r\\n\\x1a\\n")
if args and args[0] == "fail":
    raise ValueError("after writing")
return n
"""


def post_all(tmp_path: Path, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    token = new_token()
    tenant = {"name": "t", "token_hashes": [hash_token(token)], "backend": "subprocess"}
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": [tenant]}, base=tmp_path)
    gate = create_app(config, audit=AuditLog(tmp_path / "audit.jsonl")).state.gate

    async def post() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t",
                                     headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:  # fmt: skip
            return [await client.post("/v1/exec", json=body) for body in bodies]

    return asyncio.run(post())


def test_files_in_and_out_over_http(tmp_path: Path) -> None:
    data = base64.b64encode(b"a,b\nc,d\ne,f\n").decode()
    ok, failed, bad_name, bad_b64 = post_all(tmp_path, [
        {"code": PROGRAM, "files": {"data.csv": data}},
        {"code": PROGRAM, "files": {"data.csv": data}, "args": ["fail"]},
        {"code": PROGRAM, "files": {"../data.csv": data}},
        {"code": PROGRAM, "files": {"data.csv": "not base64!"}},
    ])  # fmt: skip
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["status"] == "ok" and body["value"] == 3
    by_name = {f["name"]: f for f in body["files"]}
    assert base64.b64decode(by_name["count.txt"]["content_b64"]) == b"3"
    png = by_name["chart.png"]
    assert png["media_type"] == "image/png" and png["size"] == 8
    assert png["sha256"] == hashlib.sha256(b"\x89PNG\r\n\x1a\n").hexdigest()
    assert failed.status_code == 200 and failed.json()["status"] == "error" and failed.json()["files"] == []
    for response in (bad_name, bad_b64):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["type"] == "invalid_request"
