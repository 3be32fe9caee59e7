"""The compact table ``python -m bench`` (and ``sandforge bench``) prints: one row per subject, p50 ms per workload,
then cold starts, throughput and the targets (``--full`` prints every table)."""

from __future__ import annotations

from typing import Any

from bench import report


def _cell(cell: dict[str, Any] | None) -> str:
    if not cell:
        return ""
    if cell.get("skipped"):
        return "skip"
    value = cell.get("p50_ms")
    if value is None:
        return "err" if cell.get("errors") else "-"
    return f"{value:.1f}" + ("*" if cell.get("truncated") else "")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    body = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]  # fmt: skip
    return "\n".join([line, *body])


def compact(run: dict[str, Any], targets: list[report.Target]) -> str:
    """p50 ms per (subject, workload); a subject's cold p50 and throughput beside it; the targets below."""
    subjects, latency = run["subjects"], run["latency"]
    workloads = list(latency)
    keys = list(dict.fromkeys(k for cells in latency.values() for k in cells))
    headers = ["p50 ms", *workloads, "cold", "exec/s"]
    rows = []
    for key in keys:
        short = (subjects[key].get("short") or subjects[key]["label"])[:36]
        cold_key = key.replace("_warm", "_cold") if key.endswith("_warm") else None
        tp = run["throughput"].get(key) or {}
        rows.append([
            short, *(_cell(latency[w].get(key)) for w in workloads),
            _cell(run["cold"].get(cold_key)) if cold_key else "",
            f"{tp['exec_per_s']:.1f}" if isinstance(tp.get("exec_per_s"), (int, float)) else "",
        ])  # fmt: skip
    meta = run["meta"]
    head = (f"sandforge bench {meta['started_at']}: {meta['nproc']} cores, load {meta['loadavg_at_start']} -> "
            f"{meta.get('loadavg_at_end')} (* truncated by the time budget)")  # fmt: skip
    passed = sum(1 for t in targets if t.passed)
    failed = [t.line() for t in targets if t.passed is False]
    tail = [f"targets: {passed}/{len(targets)} pass", *failed]
    return "\n".join([head, _table(headers, rows), *tail])
