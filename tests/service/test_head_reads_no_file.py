"""A HEAD of a file download is answered from the file's record (RFC 9110 section 9.3.2: the GET's headers,
no body) and never reads the file: ``GET /v1/files/{id}`` and a call's output on the dashboard. Proof that
nothing is read: the bytes are removed from disk after the upload, and the HEAD still answers from metadata."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config

BODY = b"hello, head " * 100
PROGRAM = 'with open("outputs/table.csv", "w") as f:\n    f.write("a,b\\n1,2\\n")\nreturn 1'
SAME = ("content-type", "content-length", "etag", "content-disposition", "content-security-policy", "cache-control")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, Path]]:
    root = tmp_path_factory.mktemp("head")
    token = new_token()
    tenants = [{"name": "alpha", "token_hashes": [hash_token(token)], "backend": "subprocess"}]
    app = create_app(parse_server_config({"state_dir": str(root / "state"), "tenants": tenants}, base=root),
                     audit=AuditLog(root / "audit.jsonl"))  # fmt: skip
    with TestClient(app.state.gate, base_url="https://testserver") as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client, token, root / "state"


def _assert_head_like_get(client: TestClient, path: str, **kwargs: Any) -> tuple[Any, Any]:
    got, head = client.get(path, **kwargs), client.head(path, **kwargs)
    assert (got.status_code, head.status_code) == (200, 200), (got.text, head.text)
    assert head.content == b""
    for name in SAME:
        assert head.headers.get(name) == got.headers.get(name), name
    return got, head


def _bytes_of(state: Path, file_id: str) -> Path:
    (found,) = state.rglob(f"{file_id}.bin")
    return found


def test_a_download_head_has_the_get_headers_and_reads_no_file(site: tuple[TestClient, str, Path]) -> None:
    client, _token, state = site
    stored = client.post("/v1/files", files={"file": ("notes.txt", BODY)}).json()["files"][0]
    got, head = _assert_head_like_get(client, f"/v1/files/{stored['id']}")
    assert got.content == BODY
    assert head.headers["content-length"] == str(len(BODY))
    assert head.headers["etag"] == f'"{hashlib.sha256(BODY).hexdigest()}"'

    _bytes_of(state, stored["id"]).unlink()  # the record stays: a HEAD that read the file would now fail
    head = client.head(f"/v1/files/{stored['id']}")
    assert (head.status_code, head.headers["content-length"], head.content) == (200, str(len(BODY)), b"")
    assert client.get(f"/v1/files/{stored['id']}").status_code == 404  # the GET does read it
    assert client.head("/v1/files/f_" + "0" * 32).status_code == 404


def test_a_dashboard_output_head_has_the_get_headers_and_reads_no_file(site: tuple[TestClient, str, Path]) -> None:
    client, token, state = site
    ran = client.post("/v1/exec", json={"code": PROGRAM}).json()
    assert ran["status"] == "ok", ran
    (call,) = [c for c in client.get("/v1/calls").json() if c["source"] == "http"]
    path = f"/dashboard/calls/{call['call_id']}/files/table.csv"
    session = {"Cookie": f"sf_dashboard={token}"}
    _assert_head_like_get(client, path, headers=session)

    (kept,) = [f for f in client.get("/v1/files").json()["files"] if f["name"] == "table.csv"]
    _bytes_of(state, kept["id"]).unlink()
    head = client.head(path, headers=session)
    assert (head.status_code, head.headers["content-length"], head.content) == (200, str(kept["size"]), b"")
    assert client.get(path, headers=session).status_code == 404


def test_the_stylesheet_is_built_once_for_every_get_and_head(site: tuple[TestClient, str, Path]) -> None:
    from sandforge.runtime.dashboard import render

    client, _token, _state = site
    _assert_head_like_get(client, "/dashboard/static/dashboard.css")
    before = render.stylesheet.cache_info()
    _assert_head_like_get(client, "/dashboard/static/dashboard.css")
    after = render.stylesheet.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 2)  # neither request built it again
