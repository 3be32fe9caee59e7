"""A tenant's stored files over HTTP (issue 41): upload (multipart or raw), list, download, delete; ``POST
/v1/exec`` by reference; an ok run's outputs kept with a download URL (inlined below a size); the quota
(count, bytes: 507, nothing kept); cleaning by age at start-up and on access; another tenant neither lists,
fetches, deletes nor runs with them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.exec_route import INLINE_MAX
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from sandforge.runtime.service.uploads import UploadStore

PROGRAM = """
import csv
with open("inputs/data.csv", newline="") as f:
    n = sum(1 for _ in csv.reader(f))
with open("outputs/count.txt", "w") as f:
    f.write(str(n))
with open("outputs/big.bin", "wb") as f:
    f.write(b"x" * kwargs.get("big", 0))
return n
"""
CSV = b"a,b\nc,d\ne,f\n"

Script = Callable[[dict[str, httpx.AsyncClient]], Any]


def run(tmp_path: Path, script: Script, **quotas: Any) -> Any:
    """``script`` with an in-process client per tenant (alpha, beta), through the gatekeeper."""
    tokens = {name: new_token() for name in ("alpha", "beta")}
    tenants = [{"name": n, "token_hashes": [hash_token(t)], "backend": "subprocess",
                "quotas": {"max_body_bytes": 4 << 20, **quotas}} for n, t in tokens.items()]  # fmt: skip
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": tenants}, base=tmp_path)
    gate = create_app(config, audit=AuditLog(tmp_path / "audit.jsonl")).state.gate

    async def go() -> Any:
        transport = httpx.ASGITransport(app=gate)
        clients = {
            n: httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120,
                                 headers={"Authorization": f"Bearer {t}"})
            for n, t in tokens.items()
        }  # fmt: skip
        try:
            return await script(clients)
        finally:
            for c in clients.values():
                await c.aclose()

    return asyncio.run(go())


def _error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == error_type, response.text


def test_upload_list_download_run_by_reference_and_delete(tmp_path: Path) -> None:
    async def script(c: dict[str, httpx.AsyncClient]) -> None:
        a = c["alpha"]
        multi = await a.post("/v1/files", files=[("file", ("data.csv", CSV, "text/csv")),
                                                 ("more", ("notes.txt", b"hi", "text/plain"))])  # fmt: skip
        assert multi.status_code == 201, multi.text
        data, _notes = multi.json()["files"]
        assert (data["name"], data["size"], data["kind"]) == ("data.csv", len(CSV), "upload")
        assert data["sha256"] == hashlib.sha256(CSV).hexdigest() and data["url"] == f"/v1/files/{data['id']}"
        assert data["uri"] == f"sandforge://files/{data['id']}"
        raw = await a.post("/v1/files", params={"name": "raw.bin"}, content=b"\0\1",
                           headers={"Content-Type": "application/octet-stream"})  # fmt: skip
        assert raw.status_code == 201 and raw.json()["files"][0]["media_type"] == "application/octet-stream"
        listed = (await a.get("/v1/files")).json()["files"]
        assert [f["name"] for f in listed] == ["data.csv", "notes.txt", "raw.bin"]

        got = await a.get(data["url"])
        assert got.content == CSV and got.headers["content-type"].startswith("text/csv")
        assert got.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in got.headers["content-security-policy"]
        assert got.headers["content-disposition"] == 'attachment; filename="data.csv"'

        # by reference: the bare id and the MCP resource URI name the same stored file
        for ref in (data["id"], data["uri"]):
            ran = await a.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": ref}})
            assert ran.status_code == 200 and ran.json()["value"] == 3, ran.text
        big = await a.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": data["id"]},
                                             "kwargs": {"big": INLINE_MAX + 1}})  # fmt: skip
        outputs = {f["name"]: f for f in big.json()["files"]}
        assert base64.b64decode(outputs["count.txt"]["content_b64"]) == b"3"
        assert outputs["big.bin"]["content_b64"] is None  # above the inline size: its URL only
        fetched = await a.get(outputs["big.bin"]["url"])
        assert fetched.content == b"x" * (INLINE_MAX + 1)
        kept = {f["id"]: f for f in (await a.get("/v1/files")).json()["files"]}
        assert kept[outputs["big.bin"]["id"]]["kind"] == "output"

        # bad requests: one typed 422 each
        _error(await a.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": "f_" + "0" * 32}}),
               422, "invalid_request")  # fmt: skip
        _error(await a.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": data["id"]},
                                              "files": {"data.csv": ""}}), 422, "invalid_request")  # fmt: skip
        _error(await a.post("/v1/files", files={"file": ("../x", b"1")}), 422, "invalid_request")
        _error(await a.post("/v1/files", content=b"1", headers={"Content-Type": "application/octet-stream"}),
               422, "invalid_request")  # fmt: skip
        _error(await a.post("/v1/files", json={"name": "x"}), 422, "invalid_request")

        assert (await a.delete(data["url"])).status_code == 204
        _error(await a.get(data["url"]), 404, "not_found")
        _error(await a.delete(data["url"]), 404, "not_found")

    run(tmp_path, script)


def test_another_tenant_can_neither_list_fetch_delete_nor_run_with_them(tmp_path: Path) -> None:
    async def script(c: dict[str, httpx.AsyncClient]) -> None:
        a, b = c["alpha"], c["beta"]
        up = (await a.post("/v1/files", files={"f": ("data.csv", CSV)})).json()["files"][0]
        out = (await a.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": up["id"]}})).json()
        output = out["files"][0]
        assert (await b.get("/v1/files")).json() == {"files": []}
        for file in (up, output):
            _error(await b.get(file["url"]), 404, "not_found")
            _error(await b.delete(file["url"]), 404, "not_found")
            _error(await b.post("/v1/exec", json={"code": PROGRAM, "file_refs": {"data.csv": file["id"]}}),
                   422, "invalid_request")  # fmt: skip
            assert (await a.get(file["url"])).status_code == 200  # still there for its owner

    run(tmp_path, script)


def test_the_quota_refuses_a_whole_upload_and_outputs_are_then_inlined_not_kept(tmp_path: Path) -> None:
    async def script(c: dict[str, httpx.AsyncClient]) -> None:
        a = c["alpha"]
        assert (await a.post("/v1/files", files={"f": ("one.txt", b"1")})).status_code == 201
        over = await a.post("/v1/files", files=[("f", ("two.txt", b"2")), ("g", ("three.txt", b"3"))])
        _error(over, 507, "quota_exceeded")
        assert [f["name"] for f in (await a.get("/v1/files")).json()["files"]] == ["one.txt"]  # none of the two
        _error(await a.post("/v1/files", files={"f": ("big.txt", b"x" * 200)}), 507, "quota_exceeded")
        ran = (await a.post("/v1/exec", json={"code": PROGRAM, "files": {"data.csv": ""}})).json()
        assert ran["status"] == "ok" and {f["id"] for f in ran["files"]} == {None}, ran
        assert all(f["content_b64"] is not None for f in ran["files"])

    run(tmp_path, script, max_stored_files=2, max_stored_bytes=100)


def test_files_past_their_age_are_removed_when_the_store_opens_and_on_access(tmp_path: Path) -> None:
    store = UploadStore(tmp_path, max_files=10, max_bytes=1000, max_age_s=3600)
    old = store.put("old.txt", b"old")
    record = tmp_path / "files" / f"{old.id}.json"
    aged = old.model_copy(update={"created": old.created.fromtimestamp(time.time() - 7200, old.created.tzinfo)})
    record.write_bytes(aged.model_dump_json().encode())
    orphan = tmp_path / "files" / ("f_" + "1" * 32 + ".bin")  # a put that died between its two writes
    orphan.write_bytes(b"?")
    os.utime(orphan, (time.time() - 120, time.time() - 120))
    fresh = UploadStore(tmp_path, max_files=10, max_bytes=1000, max_age_s=3600)  # opening cleans
    left = sorted(p.name for p in (tmp_path / "files").iterdir() if p.suffix != ".lock" and p.name != "parts")
    assert fresh.files() == [] and left == []
    kept = fresh.put("new.txt", b"new")
    fresh.max_age_s = 1e-9  # on access: list, read and put clean first
    assert fresh.read(kept.id) is None and fresh.files() == []


def test_references_past_the_input_bounds_are_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    from sandforge.runtime.service.uploads import BadReference
    from sandforge.sandbox import Limits

    store = UploadStore(tmp_path, max_files=10, max_bytes=10_000, max_age_s=3600)
    one = store.put("a.txt", b"x" * 600)
    limits = Limits(max_files=2, max_file_bytes=1000, max_files_bytes=1000)
    assert store.referenced({"a.txt": one.id}, {}, limits) == {"a.txt": b"x" * 600}
    for refs, inline, says in (
        ({"a.txt": one.id, "b.txt": one.id}, {}, "in all"),  # each within its bound, the two over the total
        ({"a.txt": one.id, "b.txt": one.id}, {"c.txt": b""}, "3 input files"),
        ({"a.txt": one.id}, {"a.txt": b""}, "also given in files"),
        ({"a.txt": "f_" + "2" * 32}, {}, "no such stored file"),
        ({"a.txt": "../etc/passwd"}, {}, "no such stored file"),
    ):
        with pytest.raises(BadReference, match=says):
            store.referenced(refs, inline, limits)


def test_serve_start_up_removes_every_tenants_aged_files(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    tenant = {"name": "alpha", "token_hashes": [hash_token(new_token())]}
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": [tenant]}, base=tmp_path)
    state = config.tenant_state_dir(config.tenants[0])
    old = UploadStore(state, max_files=10, max_bytes=1000, max_age_s=3600).put("old.txt", b"old")
    aged = old.model_copy(update={"created": old.created.fromtimestamp(0, old.created.tzinfo)})
    (state / "files" / f"{old.id}.json").write_bytes(aged.model_dump_json().encode())
    app = create_app(config, audit=AuditLog(None))
    with TestClient(app.state.gate):  # the lifespan: start-up, before any request
        assert not (state / "files" / f"{old.id}.bin").exists()
