"""Turns a finished run (a plain dict, also written as JSON) into tables, PASS/FAIL targets and a plot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Container backends: through dockerd (docker = runc, gvisor = runsc) and the runtimes driven directly.
CONTAINER_BACKENDS = ("docker", "gvisor", "runc", "runsc")
OUR_BACKENDS = ("subprocess", *CONTAINER_BACKENDS)


@dataclass
class Target:
    name: str
    passed: bool | None  # None: could not be evaluated in this run (a subject was skipped)
    detail: str

    def line(self) -> str:
        status = {True: "PASS", False: "FAIL", None: "N/A "}[self.passed]
        return f"{status}  {self.name}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def p50(run: dict[str, Any], workload: str, subject: str) -> float | None:
    cell = run["latency"].get(workload, {}).get(subject)
    if not cell or cell.get("skipped") or not cell.get("n"):
        return None
    value = cell.get("p50_ms")
    return float(value) if value is not None else None


def latency_table(run: dict[str, Any], *, markdown: bool = False) -> str:
    subjects = run["subjects"]
    headers = ["workload", "subject", "n", "err", "p50 ms", "p95 ms", "p99 ms", "peak MB", "p50 vs ours"]
    rows: list[list[str]] = []
    for wname, cells in run["latency"].items():
        for key, cell in cells.items():
            label = subjects[key]["label"]
            if cell.get("skipped"):
                rows.append([wname, label, "-", "-", "-", "-", "-", "-", f"skipped: {cell['skipped']}"])
                continue
            ref = subjects[key].get("ref")
            ratio = "(ours)" if subjects[key]["kind"] == "ours" else "-"
            ref_p50, mine = (p50(run, wname, ref) if ref else None), cell.get("p50_ms")
            if ref_p50 and mine:
                ratio = f"{mine / ref_p50:.2f}x {subjects[ref]['short']}"
            n = str(cell["n"]) + ("*" if cell.get("truncated") else "")
            rows.append([wname, label, n, str(cell["errors"]), _fmt(cell["p50_ms"]), _fmt(cell["p95_ms"]),
                         _fmt(cell["p99_ms"]), _fmt(cell["peak_mb"]), ratio])  # fmt: skip
    return _markdown(headers, rows) if markdown else _table(headers, rows)


def throughput_table(run: dict[str, Any], *, markdown: bool = False) -> str:
    subjects = run["subjects"]
    headers = ["subject", "exec/s", "completed", "errors", "wall s", "concurrency", "vs ours"]
    rows: list[list[str]] = []
    tps = run["throughput"]
    for key, cell in tps.items():
        label = subjects[key]["label"]
        if cell.get("skipped"):
            rows.append([label, "-", "-", "-", "-", "-", f"skipped: {cell['skipped']}"])
            continue
        ref = subjects[key].get("ref")
        ratio = "(ours)" if subjects[key]["kind"] == "ours" else "-"
        ref_cell = tps.get(ref or "", {})
        if ref_cell.get("exec_per_s"):
            ratio = f"{cell['exec_per_s'] / ref_cell['exec_per_s']:.2f}x {subjects[ref or '']['short']}"
        rows.append([label, _fmt(cell["exec_per_s"]), str(cell["completed"]), str(cell["errors"]),
                     _fmt(cell["wall_s"], 2), str(cell["concurrency"]), ratio])  # fmt: skip
    return _markdown(headers, rows) if markdown else _table(headers, rows)


def issue2_table(run: dict[str, Any], *, markdown: bool = False) -> str:
    """Trivial program, per backend cold and warm, beside the floors (all from this run)."""
    headers = ["backend", "cold p50 ms", "cold p95 ms", "warm p50 ms", "warm p95 ms"]
    cells = run["latency"].get("trivial", {})
    cold = run.get("cold", {})
    rows: list[list[str]] = []
    for backend in OUR_BACKENDS:
        c, w = cold.get(f"ours_{backend}_cold", {}), cells.get(f"ours_{backend}_warm", {})
        if c.get("skipped") or w.get("skipped") or (not c and not w):
            reason = c.get("skipped") or w.get("skipped") or "not selected"
            rows.append([f"sandforge {backend}", f"skipped: {reason}", "", "", ""])
            continue
        rows.append([f"sandforge {backend}", _fmt(c.get("p50_ms")), _fmt(c.get("p95_ms")),
                     _fmt(w.get("p50_ms")), _fmt(w.get("p95_ms"))])  # fmt: skip
    for key, label in (("python3_I_c", "python3 -I -c"), ("docker_run_runc", "docker run --rm (runc)"),
                       ("docker_run_runsc", "docker run --rm (runsc)")):  # fmt: skip
        cell = cells.get(key)
        if not cell or cell.get("skipped"):
            rows.append([label, f"skipped: {(cell or {}).get('skipped', 'not selected')}", "", "", ""])
            continue
        rows.append([label, _fmt(cell.get("p50_ms")), _fmt(cell.get("p95_ms")), "(no warm form)", ""])
    return _markdown(headers, rows) if markdown else _table(headers, rows)


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


# --- targets ---------------------------------------------------------------------------------------------


def _ratio_target(
    name: str, num: float | None, den: float | None, limit: float, text: str, *, at_least: bool
) -> Target:
    if num is None or den is None or den == 0:
        return Target(name, None, f"not measured in this run ({text})")
    ratio = num / den
    ok = ratio >= limit if at_least else ratio <= limit
    return Target(name, ok, f"{text} = {ratio:.2f}x (need {'>=' if at_least else '<='} {limit:g}x)")


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None or den == 0 else f"{num / den:.2f}x"


def _read_all_ratios(lat: Callable[[str, str], float | None], key: str) -> str:
    """Beside the 3x target (state carried, one small key touched): the cost of reading all 10 MB against the
    empty context, for us and for the python3 -I -c floor (which decodes and re-encodes all of it anyway)."""
    ours = _ratio(lat("context_10mb_read_all", key), lat("trivial", key))
    floor = _ratio(lat("context_10mb_read_all", "python3_I_c"), lat("trivial", "python3_I_c"))
    return f"reading all of it: {ours} (python3 -I -c floor: {floor})"


def evaluate(run: dict[str, Any]) -> list[Target]:
    t: list[Target] = []

    def lat(workload: str, subject: str) -> float | None:
        return p50(run, workload, subject)

    tp = run["throughput"]
    cold = run.get("cold", {})

    for ours, peer, rt in (("ours_docker_warm", "llm_sandbox_runc", "runc"),
                           ("ours_gvisor_warm", "llm_sandbox_runsc", "gVisor")):  # fmt: skip
        a, b = lat("trivial", peer), lat("trivial", ours)
        t.append(_ratio_target(
            f"warm container ({rt}) >= 10x faster than llm-sandbox with fresh isolation", a, b, 10.0,
            f"llm-sandbox {rt} p50 {_fmt(a)} ms / ours {_fmt(b)} ms", at_least=True))  # fmt: skip
    a, b = lat("trivial", "ours_subprocess_warm"), lat("trivial", "python3_I_c")
    if a is None or b is None:
        t.append(Target("warm subprocess faster than cold python3 -I -c", None, "not measured in this run"))
    else:
        t.append(Target("warm subprocess faster than cold python3 -I -c", a < b,
                        f"p50 {a:.1f} ms vs {b:.1f} ms ({b / a:.2f}x)"))  # fmt: skip

    def rate(key: str) -> float | None:
        cell = tp.get(key) or {}
        return None if cell.get("skipped") or "exec_per_s" not in cell else float(cell["exec_per_s"])

    sub = rate("ours_subprocess_warm")
    t.append(Target("throughput >= 100/s on the subprocess backend (2 cores, never-reused sandbox)",
                    None if sub is None else sub >= 100, f"{_fmt(sub)} exec/s"))  # fmt: skip
    containers = {k: rate(f"ours_{k}_warm") for k in CONTAINER_BACKENDS}
    measured = {k: v for k, v in containers.items() if v is not None}
    best = max(measured.values()) if measured else None
    t.append(Target("throughput >= 20/s on a container backend",
                    None if best is None else best >= 20,
                    ", ".join(f"{k} {v:.1f} exec/s" for k, v in measured.items()) or "not measured"))  # fmt: skip
    for backend in OUR_BACKENDS:
        key = f"ours_{backend}_warm"
        a, b = lat("context_10mb", key), lat("trivial", key)
        size = run["workloads"].get("context_10mb", {}).get("context_bytes", 0)
        target = _ratio_target(f"10 MB context cost <= 3x empty context ({backend})", a, b, 3.0,
                               f"p50 {_fmt(a)} ms carrying {size / 1048576:.2f} MB / {_fmt(b)} ms empty",
                               at_least=False)  # fmt: skip
        target.detail += "; " + _read_all_ratios(lat, key)
        t.append(target)
    a = lat("trivial", "ours_subprocess_warm")
    t.append(Target("warm subprocess p50 < 10 ms", None if a is None else a < 10, f"{_fmt(a)} ms"))
    for backend in CONTAINER_BACKENDS:
        a = lat("trivial", f"ours_{backend}_warm")
        t.append(Target(f"warm container ({backend}) p50 < 60 ms", None if a is None else a < 60, f"{_fmt(a)} ms"))
    for backend, floor in (("docker", "docker_run_runc"), ("gvisor", "docker_run_runsc")):
        c = cold.get(f"ours_{backend}_cold") or {}
        a = None if c.get("skipped") else c.get("p50_ms")
        b = lat("trivial", floor)
        t.append(_ratio_target(f"cold container ({backend}) within 1.2x of bare docker run", a, b, 1.2,
                               f"cold p50 {_fmt(a)} ms / docker run p50 {_fmt(b)} ms", at_least=False))  # fmt: skip
    return t


# --- docs ----------------------------------------------------------------------------------------------

BEGIN, END = "<!-- bench:begin (generated by `python -m bench --write-docs`) -->", "<!-- bench:end -->"


def markdown(run: dict[str, Any], targets: list[Target]) -> str:
    """The generated part of docs/benchmarks.md: machine, tables, targets, from one run."""
    m, c = run["meta"], run["config"]
    versions = c.get("peers", {}).get("versions") or {}
    lines = [
        f"Run of {m['started_at']} at commit `{m['sandforge_commit']}` ({m['bench_seconds']} s): "
        f"{m['nproc']} cores ({m['cpu']}), {m['memory_gb']} GB, kernel {m['kernel']}, {m['os']}; "
        f"Python {m['python']}, Docker {m['docker']}, {m['runc']}, {m['runsc']}; "
        f"llm-sandbox {versions.get('llm-sandbox', '-')}, smolagents {versions.get('smolagents', '-')}. "
        f"Load average {m['loadavg_at_start']} at start, {m.get('loadavg_at_end')} at end. "
        f"Image `{c['image']}`. {c['n']} executions per cell (time budget {c['budget_s']:g} s per cell), "
        f"throughput over {c['throughput_seconds']:g} s with {c['concurrency']} concurrent callers. "
        f"Validation: {c['validation']}.",
        "",
        "### Latency per execution (fresh sandbox each)",
        "",
        latency_table(run, markdown=True),
        "",
        "### Throughput (trivial program, never-reused sandboxes, all cores)",
        "",
        throughput_table(run, markdown=True),
        "",
        "### Issue 2: trivial program, cold and warm, beside the floors",
        "",
        issue2_table(run, markdown=True),
        "",
        "### Targets",
        "",
        *[
            f"- **{'PASS' if t.passed else 'FAIL' if t.passed is False else 'N/A'}** {t.name}: {t.detail}"
            for t in targets
        ],
    ]
    for name, why in (run.get("skipped_workloads") or {}).items():
        lines.append(f"- workload `{name}` skipped: {why}")
    return "\n".join(lines)


def write_docs(path: Path, run: dict[str, Any], targets: list[Target]) -> None:
    """Replace the generated block of ``path`` (between the markers) with this run's tables."""
    text = path.read_text()
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{path} has no {BEGIN!r} ... {END!r} block")
    path.write_text(f"{head}{BEGIN}\n{markdown(run, targets)}\n{END}{tail}")


# --- plot ------------------------------------------------------------------------------------------------


KIND_COLORS = {"ours": "tab:green", "floor": "tab:gray", "peer": "tab:orange"}


def plot(run: dict[str, Any], path: Path) -> None:
    """One panel per workload: the latency distribution of each subject (box + points, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w, cells in run["latency"].items() if any(c.get("latencies_ms") for c in cells.values())]
    cold = {k: v for k, v in run.get("cold", {}).items() if v.get("latencies_ms")}
    panels: list[tuple[str, dict[str, Any]]] = [(w, run["latency"][w]) for w in workloads]
    if cold:
        panels.insert(1, ("trivial, cold start (no pool)", cold))
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 + 0.42 * sum(len(c) for _, c in panels) / len(panels)
                                                       * len(panels)), squeeze=False)  # fmt: skip
    for ax, (title, cells) in zip(axes[:, 0], panels, strict=True):
        keys = [k for k, c in cells.items() if c.get("latencies_ms")]
        data = [cells[k]["latencies_ms"] for k in keys]
        labels = [run["subjects"][k]["label"] for k in keys]
        colors = [KIND_COLORS.get(run["subjects"][k]["kind"], "grey") for k in keys]
        boxes = ax.boxplot(data, vert=False, whis=(1, 99), showfliers=False, widths=0.6, patch_artist=True)
        for patch, color in zip(boxes["boxes"], colors, strict=True):
            patch.set_facecolor(color)
            patch.set_alpha(0.45)
        for i, (values, color) in enumerate(zip(data, colors, strict=True), start=1):
            ax.plot(values, [i] * len(values), "|", color=color, alpha=0.6, markersize=6)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(True, axis="x", which="both", alpha=0.3)
    axes[-1, 0].set_xlabel("latency per execution, ms (log scale; box = p25-p75, whiskers = p1-p99)")
    fig.suptitle(f"sandforge bench {run['meta']['started_at']} ({run['meta']['nproc']} cores): "
                 "green = sandforge, grey = floors, orange = peers", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
