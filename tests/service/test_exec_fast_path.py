"""The request path of POST /v1/exec made cheaper (issue 20's HTTP overhead) without changing an answer: the
gatekeeper's direct route answers exactly what the FastAPI route does, the one-pass scrubber removes every
host path the value walk removed, the audit log keeps its file open yet follows a rotation, and an execution
whose request is cancelled stays counted until it ends."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog, AuditRecord
from sandforge.runtime.service.deps import Service
from sandforge.runtime.service.scrub import PLACEHOLDER, Scrubber, host_prefixes
from sandforge.runtime.service.tenants import TenantRuntimes, hash_token, new_token, parse_server_config

VOLATILE = ("duration_s", "usage", "timings", "worker", "pool")


def _gate(tmp_path: Path, *, direct: bool) -> tuple[Any, str]:
    token = new_token()
    config = parse_server_config(
        {"state_dir": str(tmp_path / "state"), "tenants": [{"name": "t", "token_hashes": [hash_token(token)],
                                                            "quotas": {"max_timeout_s": 20}}]},
        base=tmp_path,
    )  # fmt: skip
    gate = create_app(config, audit=AuditLog(None)).state.gate
    if not direct:
        gate.direct.clear()  # every request through the FastAPI route
    return gate, token


async def _posts(gate: Any, token: str, bodies: list[Any]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=gate)
    async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                 headers={"Authorization": f"Bearer {token}"}) as client:  # fmt: skip
        out = []
        for body in bodies:
            if isinstance(body, bytes):
                out.append(await client.post("/v1/exec", content=body, headers={"content-type": "application/json"}))
            else:
                out.append(await client.post("/v1/exec", json=body))
        return out


def _stable(response: httpx.Response) -> tuple[int, Any]:
    body = response.json()
    for key in VOLATILE:
        body.get("metadata", {}).pop(key, None)
    return response.status_code, body


BODIES: list[Any] = [
    {"code": "return sum(args)", "args": [1, 2]},
    {"code": "print('out')\ncontext['k'] = 1\nreturn context", "context": {"a": [1]}},
    {"code": "import socket\nreturn 1"},  # refused by the policy
    {"code": "raise ValueError('no')"},
    {"code": f"return {sys.prefix!r} + '/lib'"},  # a host path in the value: scrubbed
    {"code": "return 1", "timeout_s": 999},  # over the tenant's maximum
    {"code": 1},
    {"code": "return 1", "extra": True},
    {"code": "return 1", "backend": "nope"},
    b"not json",
    b"",
    [1, 2],
]


def test_the_direct_route_answers_what_the_framework_route_does(tmp_path: Path) -> None:
    fast_gate, fast_token = _gate(tmp_path / "fast", direct=True)
    slow_gate, slow_token = _gate(tmp_path / "slow", direct=False)
    fast = asyncio.run(_posts(fast_gate, fast_token, BODIES))
    slow = asyncio.run(_posts(slow_gate, slow_token, BODIES))
    for body, f, s in zip(BODIES, fast, slow, strict=True):
        assert f.headers["content-type"] == "application/json", body
        if f.status_code == 200:
            assert _stable(f) == _stable(s), body
        else:  # the same status and error type; the message may locate a JSON error differently
            assert (f.status_code, f.json()["error"]["type"]) == (s.status_code, s.json()["error"]["type"]), body
            assert "\n" not in f.json()["error"]["message"]
    assert fast[4].json()["value"] == PLACEHOLDER + "/lib"
    assert sys.prefix not in fast[4].text
    assert fast[5].status_code == 422 and fast[5].json()["error"]["type"] == "limit_exceeded"


@pytest.mark.parametrize(
    "value",
    [
        {"m": "File {p}/lib/x.py", "{p}/key": ["at {p}/state", 3, None, 1.5, True]},
        {"quote": 'say "{p}"', "uni": "é {p} ü", "nested": {"deep": [[["{p}"]]]}},
        ["{p}", "{p}{p}", "no path", "{p}\n{p}"],
        "{p}",
    ],
)
def test_one_pass_scrubbing_equals_the_walk(tmp_path: Path, value: Any) -> None:
    weird = tmp_path / 'we"ird\\dir ü'
    weird.mkdir()
    scrub = Scrubber(host_prefixes([tmp_path, weird]))
    for prefix in (str(tmp_path), str(weird), sys.prefix):
        filled = json.loads(json.dumps(value).replace("{p}", prefix.replace("\\", "\\\\").replace('"', '\\"')))
        encoded = scrub.json_bytes(filled)
        assert json.loads(encoded) == scrub(filled)
        assert not any(prefix in text for text in _strings(json.loads(encoded)))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_the_audit_log_stays_open_and_follows_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "audit.jsonl"
    audit = AuditLog(path)
    audit.REOPEN_CHECK_S = 0.0  # check on every write (the default checks at most once a second)

    def record(n: int) -> AuditRecord:
        return AuditRecord(request_id=str(n), tenant="t", method="GET", path="/v1/tools", status=200,
                           duration_ms=1.0)  # fmt: skip

    audit.write(record(1))
    audit.write(record(2))
    rotated = path.with_suffix(".1")
    path.rename(rotated)
    audit.write(record(3))
    assert [json.loads(x)["request_id"] for x in rotated.read_text().splitlines()] == ["1", "2"]
    assert [json.loads(x)["request_id"] for x in path.read_text().splitlines()] == ["3"]
    assert path.stat().st_mode & 0o777 == 0o600
    audit.close()


def test_a_cancelled_request_keeps_its_execution_counted_until_it_ends(tmp_path: Path) -> None:
    config = parse_server_config({"state_dir": str(tmp_path), "tenants": [{"name": "t"}]}, base=tmp_path)
    service = Service(config, TenantRuntimes(config), AuditLog(None))
    rt = service.runtimes.get("t")
    started, finish = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        finish.wait(60)
        return 1

    async def main() -> tuple[int, int]:
        task = asyncio.create_task(service.execute(rt, work))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        during = (service.in_flight, service.admissions["t"].running)
        finish.set()
        for _ in range(6000):
            if service.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        return during

    assert asyncio.run(main()) == (1, 1)
    assert service.in_flight == 0 and service.admissions["t"].running == 0
    service.pool.shutdown()
    service.runtimes.close()
