"""The floors the speed benchmarks print beside their goals (issue 39): they measure what they say, on any
machine. No timing assertions: only that each floor runs its work and reports it."""

from __future__ import annotations

import itertools
import threading

import pytest

from bench.bench_env_pool import FLOOR_CODE, BareForks, report
from bench.bench_percall import _drive, _machine_busy_s, _print_throughput


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


def _env_pool_result(measured_ms: float) -> dict[str, object]:
    subjects = {name: {"p50_ms": ms, "p90_ms": ms, "cpu_p50_ms": 1.0} for name, ms in
                [("floor", 4.0), ("measured", measured_ms), ("bare, plain", 0.7), ("bare, package", 3.7)]}  # fmt: skip
    reachable = 4.0 + 3.7 - 0.7
    return {"module": "pandas", "rounds": 3, "load_before": [1.0], "load_after": [1.0], "subjects": subjects,
            "ratio": measured_ms / 4.0, "goal": 1.5, "goal_met": measured_ms / 4.0 <= 1.5, "before_ratio": 50.0,
            "cold_first_run_ms": 400.0, "reachable_floor_ms": reachable, "reachable_ratio": reachable / 4.0,
            "to_reachable": measured_ms / reachable}  # fmt: skip


@pytest.mark.parametrize(("measured_ms", "verdict"), [(7.1, "PASS"), (9.0, "FAIL")])
def test_the_env_pool_report_judges_the_proposed_goal_by_the_reachable_floor(measured_ms: float, verdict: str) -> None:
    lines = report(_env_pool_result(measured_ms)).splitlines()
    assert lines[-1].startswith(f"{verdict}  measured / reachable floor")
    assert any(line.startswith("FAIL  measured / floor") for line in lines)  # the 1.5x, printed as missed


def test_the_throughput_line_judges_the_proposed_share_of_the_bare_rate(capsys: pytest.CaptureFixture[str]) -> None:
    rate = {"callers": 4, "executions": 48, "ours_per_s": 8.0, "bare_per_s": 14.0, "ours_cpu_ms_per": 241.0,
            "bare_cpu_ms_per": 128.0, "ours_busy": 0.96, "bare_busy": 0.89}  # fmt: skip
    _print_throughput(rate)
    _print_throughput({**rate, "ours_per_s": 6.0})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["MISS", "PASS", "MISS", "MISS"]
