"""The floors the speed benchmarks print beside their goals (issue 39): they measure what they say, on any
machine. No timing assertions: only that each floor runs its work and reports it."""

from __future__ import annotations

import itertools
import threading

import pytest

from bench.bench_env_pool import FLOOR_CODE, BareForks
from bench.bench_percall import _drive, _machine_busy_s


@pytest.mark.parametrize(
    ("module", "body"), [("", FLOOR_CODE), ("json", "import json\nreturn json.dumps([1])\n")], ids=["plain", "module"]
)
def test_the_bare_fork_floor_times_a_child_that_ran_the_work(module: str, body: str) -> None:
    forks = BareForks("", module, body)
    try:
        samples = [forks.sample() for _ in range(3)]
    finally:
        forks.close()
    assert all(wall > 0 and cpu >= 0 for wall, cpu in samples)
    assert forks.proc.returncode == 0


def test_the_bare_fork_floor_stops_when_the_work_fails() -> None:
    forks = BareForks("", "no_such_module_here", FLOOR_CODE)
    with pytest.raises(SystemExit, match="bare fork floor"):
        forks.sample()
    forks.proc.wait(timeout=30)


def test_drive_runs_the_work_exactly_total_times_from_every_caller() -> None:
    calls, threads = itertools.count(), set()

    def one() -> None:
        next(calls)
        threads.add(threading.get_ident())

    _, busy = _drive(3, 50, one)
    assert next(calls) == 50 and busy >= 0
    assert len(threads) >= 1


def test_drive_stops_and_reports_a_failing_call() -> None:
    def one() -> None:
        raise RuntimeError("the sandbox is gone")

    with pytest.raises(SystemExit, match="the sandbox is gone"):
        _drive(2, 10, one)
    assert _machine_busy_s() > 0
