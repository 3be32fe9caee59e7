from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sandforge.runtime.store import (
    ArtifactCandidate,
    Cacheability,
    CacheabilityReason,
    ToolContract,
    ToolStore,
    assess_cacheability,
)

RUNTIME = "0.1.0"
FETCH_CODE = 'url = args[0]\nreturn Outcome.ok(tool("http").get(url))\n'
WEB_FETCHER = ToolContract(
    role="web_fetcher",
    purpose="Fetch a URL and return its body",
    deliverable={"type": "string"},
    acceptance=["non-empty body"],
    failure_policy="retry once",
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 2, 15, 7, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def store(state_dir: Path, clock: Clock) -> ToolStore:
    return ToolStore(state_dir, clock=clock)


def cacheable(reason: CacheabilityReason = CacheabilityReason.DELEGATED_CONTRACT) -> Cacheability:
    return Cacheability(cacheable=True, reason=reason, detail="test", input_sensitive=False)


def candidate(
    role: str = "web_fetcher",
    method: str = "fetch_url",
    code: str = FETCH_CODE,
    *,
    args: Sequence[object] = (),
    delegated: bool = True,
    fingerprint: str | None = WEB_FETCHER.fingerprint(),
    prompt_version: str | None = "p1",
    runtime_version: str = RUNTIME,
    capabilities: Sequence[str] = ("http_fetch",),
) -> ArtifactCandidate:
    return ArtifactCandidate(
        role=role,
        method_name=method,
        code=code,
        runtime_version=runtime_version,
        prompt_version=prompt_version,
        model="test-model",
        contract_fingerprint=fingerprint,
        capabilities=list(capabilities),
        cacheability=assess_cacheability(method, code, args, {}, is_delegated_contract=delegated),
    )
