"""Streamed uploads (issue 41): ``POST /v1/files`` (multipart and raw) and a multipart ``POST /v1/exec`` write
the body to the tenant's disk as it arrives, never whole into memory; the bound is enforced while reading
(413 at the first chunk past it, the partial file removed); a stored file appears whole or not at all;
uploads racing the quota never take the store past it; a client that goes away mid-upload leaves nothing.

In process (httpx's ASGI transport through the gatekeeper) and against a real ``sandforge serve`` on loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from tests.service.serverproc import Server, start_server

PROGRAM = """
with open("inputs/data.csv", "rb") as f:
    data = f.read()
with open("outputs/copy.csv", "wb") as f:
    f.write(data.upper())
return len(data)
"""
CHUNK = 64 << 10
TOKEN = new_token()


def files_dir(state: Path) -> Path:
    return state / "tenants" / "alpha" / "files"


def leftovers(state: Path) -> list[str]:
    """What the tenant's store holds besides its lock: stored files and parts being received."""
    root = files_dir(state)
    if not root.exists():
        return []
    names = [p.name for p in root.iterdir() if p.is_file() and p.suffix != ".lock"]
    parts = root / "parts"
    return sorted(names + ([f"parts/{p.name}" for p in parts.iterdir()] if parts.exists() else []))


def gate_of(tmp_path: Path, **quotas: Any) -> Any:
    tenants = [{"name": "alpha", "token_hashes": [hash_token(TOKEN)], "backend": "subprocess", "quotas": quotas}]
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": tenants}, base=tmp_path)
    return create_app(config, audit=AuditLog(tmp_path / "audit.jsonl")).state.gate


def client(gate: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t", timeout=120,
                             headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip


async def generated(total: int, byte: bytes = b"x") -> AsyncIterator[bytes]:
    """``total`` bytes in chunks, made as they are sent: the client never holds the body either."""
    block = byte * CHUNK
    sent = 0
    while sent < total:
        yield block[: min(CHUNK, total - sent)]
        sent += CHUNK


def error_type(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message
    return str(response.json()["error"]["type"])


def test_a_large_raw_upload_is_stored_without_the_body_in_memory(tmp_path: Path) -> None:
    size = 48 << 20
    gate = gate_of(tmp_path, max_upload_bytes=64 << 20)

    async def go() -> dict[str, Any]:
        async with client(gate) as c:
            tracemalloc.start()
            try:
                response = await c.post("/v1/files", params={"name": "big.bin"}, content=generated(size),
                                        headers={"content-type": "application/octet-stream"})  # fmt: skip
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert response.status_code == 201, response.text
            assert peak < size // 8, f"peak {peak} bytes of Python memory for a {size}-byte upload: not streamed"
            record = dict(response.json()["files"][0])
            digest = hashlib.sha256()
            async with c.stream("GET", record["url"]) as download:  # streamed from the file
                assert download.headers["content-length"] == str(size)
                async for chunk in download.aiter_bytes():
                    digest.update(chunk)
            assert digest.hexdigest() == record["sha256"]
            return record

    record = asyncio.run(go())
    expected = hashlib.sha256(b"x" * size).hexdigest()
    assert (record["size"], record["sha256"]) == (size, expected)
    stored = files_dir(tmp_path / "state") / f"{record['id']}.bin"
    assert stored.stat().st_size == size and stored.stat().st_mode & 0o777 == 0o600
    assert leftovers(tmp_path / "state") == sorted([f"{record['id']}.bin", f"{record['id']}.json"])


def test_a_body_past_the_upload_bound_is_413_and_leaves_nothing(tmp_path: Path) -> None:
    gate = gate_of(tmp_path, max_upload_bytes=1 << 20)

    async def go() -> None:
        async with client(gate) as c:
            raw = await c.post("/v1/files", params={"name": "big.bin"}, content=generated((1 << 20) + 1),
                               headers={"content-type": "application/octet-stream"})  # fmt: skip
            assert error_type(raw, 413) == "body_too_large"
            form = await c.post("/v1/files", files=[("f", ("a.csv", b"a" * 1000)), ("g", ("b.bin", b"b" * (2 << 20)))])
            assert error_type(form, 413) == "body_too_large"
            declared = await c.post("/v1/files", params={"name": "x"}, content=b"x" * ((1 << 20) + 1),
                                    headers={"content-type": "application/octet-stream"})  # fmt: skip
            assert error_type(declared, 413) == "body_too_large"
            assert (await c.get("/v1/files")).json()["files"] == []

    asyncio.run(go())
    assert leftovers(tmp_path / "state") == []


def test_a_file_larger_than_the_whole_store_is_refused_while_it_arrives(tmp_path: Path) -> None:
    gate = gate_of(tmp_path, max_upload_bytes=8 << 20, max_stored_bytes=1 << 20)

    async def go() -> None:
        async with client(gate) as c:
            over = await c.post("/v1/files", params={"name": "big.bin"}, content=generated(4 << 20),
                                headers={"content-type": "application/octet-stream"})  # fmt: skip
            assert error_type(over, 507) == "quota_exceeded"

    asyncio.run(go())
    assert leftovers(tmp_path / "state") == []


@pytest.mark.parametrize(
    ("content_type", "body", "words"),
    [
        ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=f; filename=a.csv\r\n"
         b"\r\nabc", "ends before"),
        ("multipart/form-data", b"abc", "no boundary"),
        ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=f; filename=../x\r\n"
         b"\r\nabc\r\n--xyz--\r\n", "file name"),
        ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=f\r\n\r\nabc\r\n"
         b"--xyz--\r\n", "no file part"),
        ("application/octet-stream", b"abc", "?name="),
    ],
)  # fmt: skip
def test_a_bad_streamed_body_is_one_422_and_leaves_nothing(
    tmp_path: Path, content_type: str, body: bytes, words: str
) -> None:
    gate = gate_of(tmp_path)

    async def go() -> None:
        async with client(gate) as c:
            response = await c.post("/v1/files", content=body, headers={"content-type": content_type})
            assert error_type(response, 422) == "invalid_request"
            assert words in response.json()["error"]["message"]

    asyncio.run(go())
    assert leftovers(tmp_path / "state") == []


def test_uploads_racing_the_quota_never_take_the_store_past_it(tmp_path: Path) -> None:
    size = 256 << 10
    gate = gate_of(tmp_path, max_stored_bytes=3 * size, max_stored_files=100)

    async def go() -> list[int]:
        async with client(gate) as c:
            responses = await asyncio.gather(*(
                c.post("/v1/files", params={"name": f"f{i}.bin"}, content=generated(size),
                       headers={"content-type": "application/octet-stream"})
                for i in range(8)
            ))  # fmt: skip
            listed = (await c.get("/v1/files")).json()["files"]
            assert sum(f["size"] for f in listed) <= 3 * size and len(listed) == 3
            return sorted(r.status_code for r in responses)

    assert asyncio.run(go()) == [201] * 3 + [507] * 5
    assert len(leftovers(tmp_path / "state")) == 6  # three files, each its bytes and its record; no part


def test_a_multipart_exec_streams_its_inputs_and_removes_them_after_the_run(tmp_path: Path) -> None:
    gate = gate_of(tmp_path)
    data = b"a,b\n" * 50_000

    async def go() -> None:
        async with client(gate) as c:
            response = await c.post("/v1/exec", data={"request": json.dumps({"code": PROGRAM})},
                                    files={"f": ("data.csv", data, "text/csv")})  # fmt: skip
            assert response.status_code == 200, response.text
            result = response.json()
            assert result["status"] == "ok" and result["value"] == len(data), result
            assert [f["name"] for f in result["files"]] == ["copy.csv"]
            two = await c.post("/v1/exec", data={"request": json.dumps({"code": PROGRAM, "files": {"data.csv": ""}})},
                               files={"f": ("data.csv", b"x")})  # fmt: skip
            assert "given twice" in two.json()["error"]["message"] and two.status_code == 422
            no_request = await c.post("/v1/exec", files={"f": ("data.csv", b"x")})
            assert error_type(no_request, 422) == "invalid_request"
            raw = await c.post("/v1/exec", content=b"x", headers={"content-type": "application/octet-stream"})
            assert error_type(raw, 422) == "invalid_request"

    asyncio.run(go())
    assert [n for n in leftovers(tmp_path / "state") if n.startswith("parts/")] == []


def test_a_multipart_exec_input_past_the_limits_is_413_before_anything_runs(tmp_path: Path) -> None:
    gate = gate_of(tmp_path, max_upload_bytes=256 << 20)
    limit = 8 << 20  # Limits.max_file_bytes by default

    async def go() -> None:
        async with client(gate) as c:
            tracemalloc.start()
            try:
                response = await c.post("/v1/exec", data={"request": json.dumps({"code": PROGRAM})},
                                        files={"f": ("data.csv", b"x" * (limit + 1))})  # fmt: skip
            finally:
                tracemalloc.stop()
            assert error_type(response, 413) == "body_too_large"
            assert "data.csv" in response.json()["error"]["message"]
            many = [("f", (f"f{i}.csv", b"x")) for i in range(65)]
            response = await c.post("/v1/exec", data={"request": json.dumps({"code": PROGRAM})}, files=many)
            assert error_type(response, 413) == "body_too_large"

    asyncio.run(go())
    assert leftovers(tmp_path / "state") == []
    assert not (tmp_path / "state" / "tenants" / "alpha" / "calls.jsonl").exists()  # nothing ran, nothing logged


# a real server on loopback --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("streamed")
    quotas = {"max_upload_bytes": 4 << 20, "max_stored_bytes": 8 << 20}
    srv = start_server(root, {"state_dir": "state", "tenants": [{"name": "alpha", "backend": "subprocess",
                                                                  "quotas": quotas}]})  # fmt: skip
    yield srv
    srv.stop()


def settled(state: Path) -> list[str]:
    """The store once every request the server still works on ended (a part is removed when its request ends)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = leftovers(state)
        if not any(n.startswith("parts/") for n in found):
            return found
        time.sleep(0.05)
    return leftovers(state)


@pytest.mark.slow  # the server's start (module-scoped)
def test_a_real_client_over_the_bound_gets_413_and_the_partial_file_is_removed(server: Server) -> None:
    def body() -> Iterator[bytes]:  # no Content-Length: the bound is found while reading
        for _ in range((8 << 20) // CHUNK):
            yield b"y" * CHUNK

    with server.client("alpha") as c:
        before = leftovers(server.root / "state")
        response = c.post("/v1/files", params={"name": "big.bin"}, content=body(),
                          headers={"content-type": "application/octet-stream"})  # fmt: skip
        assert error_type(response, 413) == "body_too_large"
        assert settled(server.root / "state") == before
        ok = c.post("/v1/files", files={"f": ("fine.bin", b"z" * (1 << 20))})
        assert ok.status_code == 201, ok.text
        c.delete(ok.json()["files"][0]["url"])


@pytest.mark.slow  # the server's start (module-scoped)
def test_real_clients_in_threads_racing_the_quota_never_pass_it(server: Server) -> None:
    size = 3 << 20  # the store holds 8 MiB: two of these, never three

    def upload(i: int) -> int:
        with server.client("alpha") as c:
            return c.post("/v1/files", params={"name": f"r{i}.bin"}, content=b"r" * size,
                          headers={"content-type": "application/octet-stream"}).status_code  # fmt: skip

    with ThreadPoolExecutor(6) as pool:
        statuses = sorted(pool.map(upload, range(6)))
    assert statuses == [201] * 2 + [507] * 4
    with server.client("alpha") as c:
        listed = c.get("/v1/files").json()["files"]
        assert sum(f["size"] for f in listed) == 2 * size
        for f in listed:
            c.delete(f["url"])
    assert settled(server.root / "state") == []


@pytest.mark.slow  # the server's start (module-scoped)
def test_a_client_gone_mid_upload_leaves_nothing(server: Server) -> None:
    for kind, extra in (("application/octet-stream", "?name=gone.bin"), ("multipart/form-data; boundary=b", "")):
        sock = socket.create_connection(("127.0.0.1", server.port))
        head = (f"POST /v1/files{extra} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {server.tokens['alpha']}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {3 << 20}\r\n\r\n")  # fmt: skip
        part = b"--b\r\nContent-Disposition: form-data; name=f; filename=gone.bin\r\n\r\n" if extra == "" else b""
        sock.sendall(head.encode() + part + b"g" * (1 << 20))
        deadline = time.monotonic() + 30
        while not any(n.startswith("parts/") for n in leftovers(server.root / "state")):  # it is receiving
            assert time.monotonic() < deadline, "the upload was never received"
            time.sleep(0.02)
        sock.close()
    assert settled(server.root / "state") == []
    with server.client("alpha") as c:
        assert c.get("/v1/files").json()["files"] == []
