"""The service's parts in-process: admission windows, the scrubber, constant-time authentication, the daily
provider quota as a 429, concurrency quota as a 429 (the app driven through its ASGI gatekeeper)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.quotas import QuotaExceeded, TenantAdmission, seconds_to_utc_midnight
from sandforge.runtime.service.scrub import PLACEHOLDER, Scrubber, host_prefixes
from sandforge.runtime.service.tenants import Quotas, hash_token, new_token, parse_server_config


def test_admission_counts_concurrency_and_a_sliding_minute() -> None:
    now = [1000.0]
    admission = TenantAdmission(Quotas(concurrent_executions=2, executions_per_minute=3), clock=lambda: now[0])
    admission.admit()
    admission.admit()
    with pytest.raises(QuotaExceeded) as busy:
        admission.admit()
    assert busy.value.retry_after_s == 1 and "at once" in busy.value.message
    admission.release()
    now[0] += 10
    admission.admit()
    admission.release()
    admission.release()
    with pytest.raises(QuotaExceeded) as rate:
        admission.admit()
    assert rate.value.retry_after_s == 50 and "this minute" in rate.value.message
    now[0] += 50.01
    admission.admit()  # the two first starts left the window


def test_seconds_to_midnight_is_positive() -> None:
    assert 1 <= seconds_to_utc_midnight() <= 86400


def test_the_scrubber_replaces_host_directories_everywhere(tmp_path: Path) -> None:
    scrub = Scrubber(host_prefixes([tmp_path]))
    value = {"m": f"File {sys.prefix}/lib/x.py", str(tmp_path / "k"): [f"at {tmp_path}/state", 3, None]}
    out = json.dumps(scrub(value))
    assert sys.prefix not in out and str(tmp_path) not in out and PLACEHOLDER in out
    assert scrub("return 1") == "return 1" and scrub(5) == 5


def test_authentication_compares_every_hash_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = [new_token() for _ in range(4)]
    config = parse_server_config(
        {"tenants": [{"name": "a", "token_hashes": [hash_token(t) for t in tokens[:2]]},
                     {"name": "b", "token_hashes": [hash_token(t) for t in tokens[2:]]}]},
        base=Path("/"),
    )  # fmt: skip
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: Any, b: Any) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for token in [*tokens, "sf_nobody", ""]:
        calls.clear()
        config.authenticate(token)
        assert len(calls) == 4


def _app(tmp_path: Path, tenant: dict[str, Any]) -> tuple[Any, str, AuditLog]:
    token = new_token()
    config = parse_server_config(
        {"state_dir": str(tmp_path / "state"), "tenants": [{**tenant, "token_hashes": [hash_token(token)]}]},
        base=tmp_path,
    )
    audit = AuditLog(None)
    return create_app(config, audit=audit).state.gate, token, audit


async def _post(gate: Any, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t",
                                 headers={"Authorization": f"Bearer {token}"}) as client:  # fmt: skip
        return await client.post(path, json=body)


def test_the_daily_provider_quota_is_a_429_until_midnight(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(["return 1\n", "return 2\n", "return 3\n"]))
    gate, token, audit = _app(
        tmp_path,
        {"name": "t", "provider": {"kind": "scripted", "programs": "p.json"}, "quotas": {"provider_calls_per_day": 1}},
    )
    first = asyncio.run(_post(gate, token, "/v1/agents/a/b", {}))
    assert first.json()["status"] == "ok"
    second = asyncio.run(_post(gate, token, "/v1/agents/c/d", {}))
    assert second.status_code == 429 and second.json()["error"]["type"] == "quota_exceeded"
    assert 1 <= int(second.headers["retry-after"]) <= 86400
    assert audit.count == 2


def test_concurrency_over_the_quota_is_a_429(tmp_path: Path) -> None:
    gate, token, _ = _app(tmp_path, {"name": "t", "quotas": {"concurrent_executions": 1}})

    async def both() -> list[httpx.Response]:
        spin = {"code": "while True:\n    pass\n", "timeout_s": 3}
        first = asyncio.create_task(_post(gate, token, "/v1/exec", spin))
        await asyncio.sleep(0.5)
        second = await _post(gate, token, "/v1/exec", {"code": "return 1"})
        return [await first, second]

    first, second = asyncio.run(both())
    assert first.json()["error_type"] == "timeout"
    assert second.status_code == 429 and second.headers["retry-after"] == "1"


def test_execution_slots_bound_thread_and_loop_executions_together(tmp_path: Path) -> None:
    """One slot: an execution awaited on the loop (``/v1/exec``) and one on a thread (an agent call) never run
    at once; a cancelled waiter gives back its admission; a quota refusal holds no slot."""
    from sandforge.runtime.service.deps import ApiError, Service
    from sandforge.runtime.service.tenants import TenantRuntimes

    config = parse_server_config(
        {"state_dir": "state", "execution_slots": 1,
         "tenants": [{"name": "t", "quotas": {"concurrent_executions": 3}}]}, base=tmp_path,
    )  # fmt: skip
    runtimes = TenantRuntimes(config)
    service = Service(config, runtimes, AuditLog(None))
    rt = runtimes.get("t")
    running: list[str] = []
    overlap: list[list[str]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def on_loop() -> str:
            running.append("loop")
            await release.wait()
            running.remove("loop")
            return "loop"

        def on_thread() -> str:
            overlap.append(list(running))
            return "thread"

        first = asyncio.create_task(service.execute_async(rt, on_loop))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(service.execute(rt, on_thread))
        waiter = asyncio.create_task(service.execute_async(rt, on_loop))
        await asyncio.sleep(0.05)
        assert not second.done() and not waiter.done() and service.in_flight == 3  # waiting for the slot, counted
        with pytest.raises(ApiError) as refused:  # a fourth: over the tenant's concurrency, 429 at once
            await service.execute_async(rt, on_loop)
        assert refused.value.status == 429 and service.in_flight == 3
        waiter.cancel()  # gone while waiting: its admission and count are given back, it never ran
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert service.in_flight == 2 and waiter.cancelled()
        release.set()
        assert await first == "loop" and await second == "thread"
        assert service.in_flight == 0 and overlap == [[]]  # the thread ran only once the loop's execution ended
        assert await service.execute_async(rt, on_loop) == "loop"  # the slot is free again

    try:
        asyncio.run(scenario())
    finally:
        service.pool.shutdown()
        runtimes.close()
