"""`sandforge bench` / `python -m bench` (issue 21): tracked files are written only with --write-docs, the
default output is one compact table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench import report, run
from bench.compact import compact
from sandforge.runtime.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_without_write_docs_results_go_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDFORGE_CACHE_DIR", str(tmp_path))
    out, plot = run.outputs(run.parse_args([]))
    assert out == tmp_path / "bench" and plot == tmp_path / "bench" / "bench-latency.png"
    out, plot = run.outputs(run.parse_args(["--write-docs"]))
    assert out == REPO / "bench" / "results" and plot == REPO / "docs" / "bench-latency.png"


@pytest.mark.parametrize("args", [["--out", "bench/results"], ["--plot", "docs/bench-latency.png"]])
def test_a_tracked_target_is_refused_without_write_docs(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    if not run.tracked(REPO / "bench" / "results" / "latest.json"):
        pytest.skip("not a git checkout")
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match="tracked by git; pass --write-docs"):
        run.outputs(run.parse_args(args))
    assert run.main([*args, "--backends", "subprocess"]) == 2  # refused before anything is measured


def test_the_compact_table_has_one_row_per_subject() -> None:
    latest = json.loads((REPO / "bench" / "results" / "latest.json").read_text())
    text = compact(latest, report.evaluate(latest))
    lines = text.splitlines()
    subjects = {k for cells in latest["latency"].values() for k in cells}
    assert lines[1].split()[:2] == ["p50", "ms"] and len(lines) == 2 + len(subjects) + 1 + sum(
        1 for t in report.evaluate(latest) if t.passed is False)  # fmt: skip
    assert all(len(line) <= 200 for line in lines[1:])
    assert lines[2].split()[0] == "subprocess"


def test_sandforge_bench_passes_its_flags_to_the_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from sandforge.runtime.cli import bench_cmd

    seen: list[list[str]] = []

    class Done:
        returncode = 3

    def fake(argv: list[str], **_: object) -> Done:
        seen.append(argv)
        return Done()

    monkeypatch.setattr(subprocess, "run", fake)
    result = CliRunner().invoke(main, ["bench", "--quick", "--backends", "subprocess", "--write-docs", "-n", "2"])
    assert result.exit_code == 3
    assert seen[0][1:] == ["-m", "bench", "--quick", "--backends", "subprocess", "--write-docs", "-n", "2"]
    assert bench_cmd.CHECKOUT == REPO
