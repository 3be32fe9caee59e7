"""The server's thread count and heap stay flat under load (issue 20's soak goal).

Thread pools are bounded, but a bounded pool that starts threads on demand still grows for minutes under a
workload reaching new peaks: the server starts every thread of each of its pools when it makes the pool
(``sandbox.prestart``). Its heap: glibc arenas capped and free pages trimmed (``service.memory``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from sandforge.runtime.service import memory
from sandforge.runtime.service.tenants import service_threads
from sandforge.sandbox.pool import WarmPool
from sandforge.sandbox.prestart import prestart
from tests.sandbox.test_pool import FakeWorker
from tests.service.serverproc import start_server


def _names(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix + "_"))


def test_prestart_starts_every_thread_and_a_burst_adds_none() -> None:
    pool = ThreadPoolExecutor(6, thread_name_prefix="t-prestart")
    try:
        assert prestart(pool) == 6
        assert _names("t-prestart") == 6
        gate = threading.Event()
        futures = [pool.submit(gate.wait, 10) for _ in range(20)]  # more work than threads, all at once
        gate.set()
        for f in futures:
            f.result(timeout=10)
        assert _names("t-prestart") == 6
        assert prestart(pool, 3) == 6  # already there: nothing more
    finally:
        pool.shutdown()


def test_a_pool_on_demand_grows_under_the_same_burst() -> None:
    """The behaviour prestart removes (so the test above can fail)."""
    pool = ThreadPoolExecutor(6, thread_name_prefix="t-ondemand")
    try:
        pool.submit(lambda: None).result()
        before = _names("t-ondemand")
        gate = threading.Event()
        futures = [pool.submit(gate.wait, 10) for _ in range(20)]
        gate.set()
        for f in futures:
            f.result(timeout=10)
        assert before == 1 and _names("t-ondemand") == 6
    finally:
        pool.shutdown()


def test_prestart_of_a_pool_shut_down_returns_at_once() -> None:
    pool = ThreadPoolExecutor(4)
    pool.shutdown()
    assert prestart(pool) == 0


def test_a_warm_pool_told_to_prestart_holds_its_spawn_threads_from_the_start() -> None:
    pool = WarmPool(FakeWorker, size=1, idle_s=60, name="pre", prestart_threads=True)  # type: ignore[arg-type]
    lazy = WarmPool(FakeWorker, size=1, idle_s=60, name="lazy")  # type: ignore[arg-type]
    try:
        assert pool.wait_ready(1, timeout=10) and lazy.wait_ready(1, timeout=10)
        assert _names("sandforge-spawn-pre") == pool.waiting_concurrency
        assert _names("sandforge-spawn-lazy") < lazy.waiting_concurrency
    finally:
        pool.close()
        lazy.close()


def test_the_service_threads_are_bounded_by_the_slots_and_all_started() -> None:
    threads = service_threads(3)
    try:
        assert len(threads.short._threads) == 3 and len(threads.long._threads) == 3
        big = service_threads(40)
        assert len(big.short._threads) == 8 and len(big.long._threads) == 40
        big.shutdown()
    finally:
        threads.shutdown()


def test_arenas_are_capped_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    if memory._glibc() is None:
        pytest.skip("not glibc")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.cap_malloc_arenas() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert memory.cap_malloc_arenas() is True
    assert isinstance(memory.malloc_trim(), bool)


def test_the_trimmer_trims_on_its_executor_until_stopped() -> None:
    if memory._glibc() is None:
        pytest.skip("not glibc")
    seen: list[str] = []

    def trim() -> bool:
        seen.append(threading.current_thread().name)
        return True

    async def main() -> int:
        executor = ThreadPoolExecutor(1, thread_name_prefix="t-trim")
        trimmer = memory.Trimmer(executor, interval_s=0.01, trim=trim)
        trimmer.start()
        while trimmer.runs < 3:
            await asyncio.sleep(0.01)
        await trimmer.stop()
        after = trimmer.runs
        await asyncio.sleep(0.05)
        executor.shutdown()
        return after - trimmer.runs

    assert asyncio.run(main()) == 0
    assert len(seen) >= 3 and all(name.startswith("t-trim") for name in seen)


def test_a_burst_of_calls_starts_no_thread_in_the_server(tmp_path: Path) -> None:
    """Sixteen clients at once against eight slots and one warm worker: async waiters pile up on the warm
    pool, the awaited executions reap and clean up on the loop's pools, agent calls take the slot threads.
    The server's thread count after the burst is the one it had after its first call."""
    (tmp_path / "programs.json").write_text(json.dumps(["return sum(args)\n"] * 50))
    config = {
        "state_dir": "state", "backend": "subprocess", "pool_size": 1, "execution_slots": 8,
        "tenants": [{"name": "a", "provider": {"kind": "scripted", "programs": "programs.json"},
                     "quotas": {"concurrent_executions": 64, "executions_per_minute": 100_000}}],
    }  # fmt: skip
    server = start_server(tmp_path, config)
    try:
        proc = psutil.Process(server.proc.pid)
        with server.client("a") as c:
            assert c.post("/v1/exec", json={"code": "return 1"}).status_code == 200
            for n in range(2):  # generated and stored, then reused (which starts the store's write-behind thread)
                assert c.post("/v1/agents/calc/add", json={"args": [1, n]}).json()["value"] == 1 + n
        time.sleep(0.5)  # the warm pool's first refill
        before = proc.num_threads()
        errors: list[str] = []

        def client(i: int) -> None:
            with server.client("a") as c:
                for n in range(6):
                    path, body = ("/v1/exec", {"code": "return sum(args)", "args": [i, n]}) if n % 3 else (
                        "/v1/agents/calc/add", {"args": [i, n]})  # fmt: skip
                    r = c.post(path, json=body)
                    if r.status_code != 200 or r.json().get("value") != i + n:
                        errors.append(r.text[:200])

        clients = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        assert errors == []
        assert proc.num_threads() <= before
    finally:
        server.stop()
