"""bench/bench_serve.py on its quick setting: a well-formed report, and a soak without unexpected errors
(no timing assertions: the numbers are for docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_serve


@pytest.mark.slow
def test_quick_report_is_well_formed(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    assert bench_serve.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    overhead, soak = report["overhead"], report["soak"]
    assert overhead["api_ms"]["n"] == overhead["http_ms"]["n"] == overhead["lean_ms"]["n"] == 60
    assert isinstance(overhead["lean_added_p50_ms"], float)
    assert isinstance(overhead["added_p50_ms"], float)
    spaced = report["overhead_spaced"]
    assert spaced["gap_ms"] == 20 and spaced["api_ms"]["n"] == spaced["lean_ms"]["n"] == 30
    assert isinstance(spaced["added_p50_ms"], float) and isinstance(spaced["lean_added_p50_ms"], float)
    assert soak["unexpected_errors"] == 0, soak["error_samples"]
    assert soak["expected_401"] > 0
    assert soak["exec_ms"]["n"] > 0 and soak["agent_ms"]["n"] > 0
    assert soak["exit_code"] == 0
    assert set(soak["late"]) == {"rss_mb", "fds", "threads", "children"}
