"""bench/bench_compat.py runs on its quick setting and writes a well-formed report (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_compat


def test_quick_report_is_well_formed(tmp_path: Path) -> None:
    out = tmp_path / "compat.json"
    assert bench_compat.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["corpus_programs"] >= 100
    for key in ("corpus_compile_run_cold", "corpus_compile_run", "corpus_exec"):
        assert set(report[key]) == {"median", "p90", "worst"} and report[key]["median"] > 0
    assert {row["construct"] for row in report["constructs"]} >= {"append", "name +=", "swap", "method call"}
    assert report["model_style"]["exec_ratio"] > 0
