"""N real processes hammering one store lose no update (file lock + re-read under the lock)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from sandforge.runtime.store import FailureClass, ToolStore
from tests.store.conftest import candidate

PROCESSES = 4
ROUNDS = 25


def _hammer(state_dir: str, worker: int, rounds: int, barrier: object) -> None:
    store = ToolStore(state_dir, pattern_window_cap=10_000)
    barrier.wait()  # type: ignore[attr-defined]
    for n in range(rounds):
        if n % 5 == 4:
            store.record_failure("web_fetcher", "fetch_url", FailureClass.EXTRINSIC, f"w{worker} n{n}")
        else:
            store.record_success("web_fetcher", "fetch_url")
        store.record_success("web_fetcher", f"method_{worker}") if n == 0 else None
        store.record_pattern("assistant", "ask", [f"worker_{worker}"])


@pytest.mark.slow
def test_concurrent_processes_lose_no_count(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    store = ToolStore(state_dir)
    store.record_regeneration(candidate())
    for w in range(PROCESSES):
        store.record_regeneration(candidate(method=f"method_{w}"))

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_hammer, args=(str(state_dir), w, ROUNDS, barrier)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    assert [p.exitcode for p in procs] == [0] * PROCESSES

    fresh = ToolStore(state_dir, pattern_window_cap=10_000)
    art = fresh.lookup("web_fetcher", "fetch_url").artifact
    assert art is not None
    failures = PROCESSES * (ROUNDS // 5)
    successes = PROCESSES * ROUNDS - failures
    assert art.success_count == 1 + successes
    assert art.failure_count == art.extrinsic_failure_count == failures
    for w in range(PROCESSES):
        per_worker = fresh.lookup("web_fetcher", f"method_{w}").artifact
        assert per_worker is not None and per_worker.success_count == 2

    entry = fresh.get_tool("web_fetcher")
    assert entry is not None
    saves = 1 + PROCESSES
    assert entry.usage_count == saves + PROCESSES * ROUNDS + PROCESSES
    assert entry.failure_count == failures
    assert sorted(entry.methods) == sorted(["fetch_url", *(f"method_{w}" for w in range(PROCESSES))])

    events = fresh.patterns.events("assistant")
    assert len(events) == PROCESSES * ROUNDS
    for w in range(PROCESSES):
        assert sum(e.capability_patterns == [f"worker_{w}"] for e in events) == ROUNDS
    assert not [p for p in state_dir.rglob("*") if ".corrupt-" in p.name or p.name.endswith(".tmp")]
