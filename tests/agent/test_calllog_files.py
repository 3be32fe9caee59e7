"""The call log as a file many processes append to: no line lost or torn, private modes, no hang on a
FIFO in its place (issue 14 items 2 and 3)."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sandforge.runtime.agent import CallLog, CallRecord, read_records

PROCESSES = 6
RECORDS = 40


def _record(worker: int, n: int) -> CallRecord:
    return CallRecord(
        trace_id=f"t{worker}", call_id=f"c{worker}-{n}", depth=0, role="calc", method="add", args=["x" * 3000],
        started_at=datetime.now(UTC), duration_s=0.0, status="ok", value=n, attempt_id=f"a{worker}-{n}",
        attempts=1, attempt_stage="executed",
    )  # fmt: skip


def _append(path: str, worker: int, barrier: object) -> None:
    log = CallLog(path)
    barrier.wait()  # type: ignore[attr-defined]
    for n in range(RECORDS):
        log.append(_record(worker, n))


@pytest.mark.slow
def test_concurrent_processes_lose_and_tear_no_record(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "calls.jsonl"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_append, args=(str(path), w, barrier)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    records = list(read_records(path))
    assert len(path.read_bytes().splitlines()) == len(records) == PROCESSES * RECORDS
    assert {r.call_id for r in records} == {f"c{w}-{n}" for w in range(PROCESSES) for n in range(RECORDS)}


def test_the_log_and_its_directory_are_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "logs" / "calls.jsonl"
    CallLog(path).append(_record(0, 0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700


def test_a_fifo_in_place_of_the_log_neither_hangs_nor_fails_the_call(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    os.mkfifo(path)
    log = CallLog(path)
    log.append(_record(0, 0))  # logged as a warning; the record stays in memory
    assert [r.call_id for r in log.records] == ["c0-0"]
