"""The benchmark is a tool, not a test: this only checks that it runs on its tiny setting (subprocess
backend, no peers needed) and writes a well-formed report. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.loops import Failed, Result, latency, throughput
from bench.stats import percentile
from bench.workloads import build, run_plain, script

REPO = Path(__file__).resolve().parents[2]


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_workloads_are_well_formed_and_distinct() -> None:
    workloads = {w.name: w for w in build(quick=True)}
    assert {"trivial", "cpu_50ms", "context_1mb", "context_10mb", "context_1mb_read_all", "context_10mb_read_all",
            "many_programs"} <= set(workloads)  # fmt: skip
    many = workloads["many_programs"].programs
    assert len({p.code for p in many}) == len(many)
    assert workloads["context_10mb"].context_bytes > workloads["context_1mb"].context_bytes
    for w in workloads.values():
        for p in w.programs:
            assert run_plain(p.code, json.loads(p.context_json)) == p.expected


def test_script_has_the_program_contract() -> None:
    program = {w.name: w for w in build(quick=True)}["context_1mb_read_all"].programs[0]
    out = subprocess.run(
        [sys.executable, "-I", "-c", script(program.code)],
        input=program.context_json.encode(),
        capture_output=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["value"] == program.expected
    assert data["context"]["count"] == program.expected
    assert data["maxrss_kb"] > 0


def test_loops_count_failures_and_wrong_values() -> None:
    programs = build(quick=True)[0].programs
    calls = iter([Result(2), Result(3), Failed("boom")])

    def run_one(_: object) -> Result:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    series = latency(run_one, programs, n=3, budget_s=10, warmup=0)
    assert len(series.latencies_s) == 1 and series.errors == 2
    tp = throughput(lambda _: Result(2), programs[0], seconds=0.05, concurrency=2)
    assert tp.completed > 0 and tp.errors == 0 and tp.wall_s > 0


def test_quick_run_writes_a_well_formed_report(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--backends", "subprocess", "--peers", "no", "--out", str(tmp_path),
         "-n", "2", "--seconds", "0.3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "latest.json").read_text())
    assert {"meta", "config", "subjects", "workloads", "latency", "cold", "throughput", "targets"} <= set(run)
    for name in ("trivial", "cpu_50ms", "context_1mb", "context_10mb", "many_programs"):
        cell = run["latency"][name]["ours_subprocess_warm"]
        assert cell["errors"] == 0, cell
        assert cell["n"] >= 2 and cell["p50_ms"] > 0 and len(cell["latencies_ms"]) == cell["n"]
    assert run["throughput"]["ours_subprocess_warm"]["completed"] > 0
    assert run["cold"]["ours_subprocess_cold"]["n"] >= 2
    names = {t["name"] for t in run["targets"]}
    assert any("warm subprocess p50" in n for n in names)
    assert all(t["passed"] in (True, False, None) for t in run["targets"])
    # the default output is one compact table (issue 21): a row per subject, then the targets' tally
    assert proc.stdout.splitlines()[1].startswith("p50 ms") and "targets: " in proc.stdout
    assert any(line.startswith("subprocess ") for line in proc.stdout.splitlines())
    assert (tmp_path / "bench-latency.png").stat().st_size > 1000
    # the tables render from the JSON alone
    assert report.latency_table(run, markdown=True).startswith("| workload")


@pytest.mark.parametrize("flag", ["--help"])
def test_cli_help(flag: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", flag], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "--quick" in proc.stdout
