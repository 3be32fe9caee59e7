"""``python -m bench``: every workload on every subject in one run, then tables, targets, JSON and a plot."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import loops, report
from bench.artifact import ArtifactBench, artifact_workload
from bench.compact import compact
from bench.stats import Series
from bench.subjects import (
    Ours,
    Peer,
    Subject,
    Validator,
    docker_run_floor,
    ensure_peers_venv,
    peers_status,
    python_floor,
)
from bench.workloads import Workload, build

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results"
DEFAULT_PLOT = REPO / "docs" / "bench-latency.png"
ALL_BACKENDS = ("subprocess", "docker", "gvisor", "runc", "runsc")
SHORT = {
    **{f"ours_{b}_warm": b for b in ALL_BACKENDS},
    **{f"ours_{b}_cold": f"{b} cold" for b in ALL_BACKENDS},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny setting: few runs, small contexts, 10 programs")
    p.add_argument("--backends", default=",".join(ALL_BACKENDS), help="comma list of our backends to measure")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for latest.json (default: the user cache's sandforge/bench; bench/results with "
                        "--write-docs)")  # fmt: skip
    p.add_argument("--plot", type=Path, default=None,
                   help="PNG path (default OUT/bench-latency.png; docs/bench-latency.png with "
                        "--write-docs)")  # fmt: skip
    p.add_argument("--peers", choices=("auto", "yes", "no"), default="auto",
                   help="auto: use the peers venv if present (a full run creates it); no: skip peers")  # fmt: skip
    p.add_argument("--floors", choices=("yes", "no"), default="yes", help="measure python3 -I -c and docker run")
    p.add_argument("-n", type=int, default=None, help="executions per latency cell (default 30, quick 3)")
    p.add_argument("--budget", type=float, default=None, help="seconds per latency cell before truncating")
    p.add_argument("--seconds", type=float, default=None, help="throughput wall time per subject (default 10)")
    p.add_argument("--concurrency", type=int, default=None, help="throughput threads (default 2 x nproc)")
    p.add_argument("--workloads", default=None, help="comma list of workloads (default all)")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--write-docs", action="store_true",
                   help="put this run's tables into docs/benchmarks.md and its results into the tracked "
                        "bench/results/latest.json and docs/bench-latency.png (never written without it)")  # fmt: skip
    p.add_argument("--full", action="store_true", help="print every table (default: one compact table)")
    p.add_argument("--json", action="store_true", help="print the run as one JSON object instead of tables")
    return p.parse_args(argv)


def default_out() -> Path:
    """Where a run's results go without --write-docs: outside the repository's tracked files."""
    import platformdirs

    return Path(os.environ.get("SANDFORGE_CACHE_DIR") or platformdirs.user_cache_dir("sandforge")) / "bench"


def tracked(path: Path) -> bool:
    """Whether git tracks ``path`` in this repository (no git, or outside it: not tracked)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", str(path.resolve())],
                              capture_output=True, timeout=20, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def outputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """The results directory and plot path of this run; refuses (exit 2) to overwrite a tracked file without
    --write-docs."""
    out_dir: Path = args.out or (DEFAULT_OUT if args.write_docs else default_out())
    default_plot = DEFAULT_PLOT if out_dir.resolve() == DEFAULT_OUT.resolve() else out_dir / "bench-latency.png"
    plot_path: Path = args.plot or default_plot
    if not args.write_docs:
        for path in (out_dir / "latest.json", plot_path):
            if tracked(path):
                raise SystemExit(f"error: {path} is tracked by git; pass --write-docs to overwrite it "
                                 "(or choose another --out/--plot)")
    return out_dir, plot_path


class _FewPerLogger(logging.Filter):
    """Library warnings during a run (e.g. a pool retrying while the engine is down) at most 3 per logger."""

    def __init__(self, limit: int = 3) -> None:
        super().__init__()
        self.limit = limit
        self.seen: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        count = self.seen[record.name] = self.seen.get(record.name, 0) + 1
        if count == self.limit + 1:
            record.msg, record.args = f"(further {record.name} messages suppressed in this run)", ()
        return count <= self.limit + 1


def machine() -> dict[str, Any]:
    def cmd(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    mem_kb = 0
    try:
        with open("/proc/meminfo") as fh:
            mem_kb = int(fh.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(mem_kb / 1048576, 1),
        "kernel": platform.release(),
        "os": cmd("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"),
        "python": platform.python_version(),
        "docker": cmd("docker", "version", "--format", "{{.Server.Version}}"),
        "runc": cmd("sh", "-c", "runc --version | head -1"),
        "runsc": cmd("sh", "-c", "runsc --version | head -1"),
        "sandforge_commit": cmd("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def image_tag() -> str | None:
    try:
        from sandforge.sandbox.image import expected_tag

        return expected_tag()
    except Exception:
        return None


def build_subjects(args: argparse.Namespace, log: Callable[[str], None], validator: Validator,
                   ) -> tuple[list[Ours], list[Subject], dict[str, Any]]:  # fmt: skip
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(ALL_BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backend(s): {', '.join(sorted(unknown))}")
    ours = [Ours(b, warm=True, validator=validator) for b in backends]
    for o in ours:
        if o.skipped:
            log(f"  {o.label}: skipped ({o.skipped})")
    cold = [Ours(b, warm=False, validator=validator) for b in backends]
    tag = image_tag()
    docker_reason = next((o.skipped for o in ours if o.backend == "docker"), None)
    gvisor_reason = next((o.skipped for o in ours if o.backend == "gvisor"), None)
    others: list[Subject] = []
    if args.floors == "yes":
        others.append(python_floor())
        if "docker" in backends:
            others.append(docker_run_floor("runc", tag, docker_reason))
        if "gvisor" in backends:
            others.append(docker_run_floor("runsc", tag, gvisor_reason))
    peer_info: dict[str, Any] = {}
    if args.peers != "no":
        if args.peers == "yes" or not args.quick:
            try:
                ensure_peers_venv(log)
            except (OSError, subprocess.SubprocessError) as exc:
                log(f"  could not create the peers venv: {exc}")
        versions, why = peers_status()
        peer_info = {"versions": versions, "skipped": why}
        if why:
            log(f"  peers: skipped ({why})")
        for runtime, backend, reason in (("runc", "docker", docker_reason), ("runsc", "gvisor", gvisor_reason)):
            if backend not in backends:
                continue
            peer = Peer(f"llm_sandbox_{runtime}", f"llm-sandbox {runtime} (fresh container)", "llm_sandbox",
                        ref=f"ours_{backend}_warm", runtime=runtime, image=tag,
                        note="SandboxSession per execution; same engine and image")  # fmt: skip
            peer.skipped = why or reason
            others.append(peer)
        smol = Peer("smolagents_local", "smolagents LocalPythonExecutor (NOT a security boundary)", "smolagents",
                    ref="ours_subprocess_warm", note="in-process AST interpreter, fresh executor per execution",
                    processes_for_throughput=os.cpu_count() or 1)  # fmt: skip
        smol.skipped = why
        others.append(smol)
    return [*ours, *cold], others, peer_info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    settings = _Settings(
        n=args.n or (3 if quick else 30),
        budget=args.budget or (20.0 if quick else 45.0),
        seconds=args.seconds or (1.0 if quick else 10.0),
        concurrency=args.concurrency or 2 * (os.cpu_count() or 1),
    )
    try:
        out_dir, plot_path = outputs(args)
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 2

    from sandforge.runtime.cli.progress import Steps, interactive

    shown = Steps("sandforge bench").__enter__() if interactive() else None  # a spinner on a terminal

    def log(msg: str) -> None:
        if shown is not None:
            shown.step(msg.strip())
        else:
            print(msg, file=sys.stderr, flush=True)

    _configure_logging()
    started = time.monotonic()
    meta = {"started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"), **machine()}
    log(f"sandforge bench ({'quick' if quick else 'full'}) on {meta['nproc']} cores, kernel {meta['kernel']}")
    validator = Validator()
    if validator.unavailable:
        log(f"  validation: skipped ({validator.unavailable})")
    subjects_ours, others, peer_info = build_subjects(args, log, validator)
    warm = [s for s in subjects_ours if s.warm]
    cold = [s for s in subjects_ours if not s.warm]
    workloads, art_bench, extra_skips = _select_workloads(args, log)

    all_subjects: list[Subject] = [*warm, *others]
    run: dict[str, Any] = {
        "meta": meta,
        "config": {"quick": quick, "n": settings.n, "budget_s": settings.budget,
                   "throughput_seconds": settings.seconds, "concurrency": settings.concurrency,
                   "image": image_tag(), "peers": peer_info,
                   "validation": "runtime.guardrails default_policy" if validator.fn else validator.unavailable},
        "subjects": {s.key: {"label": s.label, "kind": s.kind, "ref": s.ref, "note": s.note,
                             "short": SHORT.get(s.key, s.label), "skipped": s.skipped}
                     for s in [*all_subjects, *cold]},
        "workloads": {},
        "latency": {},
        "cold": {},
        "throughput": {},
        "skipped_workloads": extra_skips,
    }  # fmt: skip

    try:
        _measure(run, args, settings, workloads, all_subjects, cold, art_bench, log)
    finally:
        if art_bench is not None:
            art_bench.close()
        for s in [*subjects_ours, *others]:
            s.close()
        if shown is not None:
            shown.__exit__(None, None, None)

    targets = report.evaluate(run)
    run["targets"] = [t.as_dict() for t in targets]
    run["meta"]["bench_seconds"] = round(time.monotonic() - started, 1)
    run["meta"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    json_path = _write(run, out_dir, plot_path, log)
    if args.json:
        print(json.dumps(run))
    else:
        print(render(run, targets) if args.full else compact(run, targets))
    if args.write_docs:
        report.write_docs(REPO / "docs" / "benchmarks.md", run, targets)
    log(f"results: {json_path}  plot: {plot_path}  ({run['meta']['bench_seconds']} s)")
    return 0


@dataclass(frozen=True)
class _Settings:
    """How much to measure: runs per latency cell, seconds per cell, throughput seconds and concurrency."""

    n: int
    budget: float
    seconds: float
    concurrency: int


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_FewPerLogger())
    handler.setFormatter(logging.Formatter("  [%(name)s] %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _select_workloads(
    args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[list[Workload], ArtifactBench | None, dict[str, str]]:
    """The workloads asked for (``--workloads``), the persisted-artifact one when it can run, and why not."""
    workloads = build(args.quick)
    if args.workloads:
        wanted = {w.strip() for w in args.workloads.split(",")}
        workloads = [w for w in workloads if w.name in wanted]
    extra_skips: dict[str, str] = {}
    art, art_bench, art_skip = artifact_workload()
    if art is not None and (not args.workloads or art.name in args.workloads):
        workloads.append(art)
    elif art_skip:
        extra_skips["persisted_artifact"] = art_skip
        log(f"  persisted_artifact: skipped ({art_skip})")
    return workloads, art_bench, extra_skips


def _measure(
    run: dict[str, Any],
    args: argparse.Namespace,
    settings: _Settings,
    workloads: list[Workload],
    all_subjects: list[Subject],
    cold: list[Subject],
    art_bench: ArtifactBench | None,
    log: Callable[[str], None],
) -> None:
    """Latency per workload and subject, cold starts, throughput: into ``run``."""
    n, budget = settings.n, settings.budget
    for w in workloads:
        run["workloads"][w.name] = {"title": w.title, "programs": len(w.programs), "context_bytes": w.context_bytes,
                                    "validate": w.validate, "notes": w.notes}  # fmt: skip
        run["latency"][w.name] = {}
        many = len(w.programs) > 1
        count, cell_budget = (max(n, len(w.programs)), budget * 2) if many else (n, budget)
        for s in all_subjects:
            if w.name == "persisted_artifact" and art_bench is not None:
                cell = measure_artifact(s, w, art_bench, count, cell_budget, log)
            else:
                cell = measure_latency(s, w, count, cell_budget, log)
            run["latency"][w.name][s.key] = cell
    if not args.workloads or "trivial" in args.workloads:
        trivial = build(args.quick)[0]
        for s in cold:
            run["cold"][s.key] = measure_latency(s, trivial, n, budget, log)
    if not args.no_throughput:
        trivial = build(args.quick)[0]
        for s in all_subjects:
            run["throughput"][s.key] = measure_throughput(s, trivial, settings.seconds, settings.concurrency, log)


def _write(run: dict[str, Any], out_dir: Path, plot_path: Path, log: Callable[[str], None]) -> Path:
    """``latest.json`` (atomically) and the plot; the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "latest.json"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(run, indent=1) + "\n")
    tmp.replace(json_path)
    try:
        report.plot(run, plot_path)
        run["meta"]["plot"] = str(plot_path)
    except Exception as exc:  # the plot is a convenience; the numbers are in the JSON
        log(f"plot failed: {type(exc).__name__}: {exc}")
    return json_path


def measure_latency(s: Subject, w: Workload, n: int, budget: float, log: Callable[[str], None]) -> dict[str, Any]:
    if s.skipped:
        return {"skipped": s.skipped}
    t0 = time.monotonic()
    try:
        if isinstance(s, Ours):
            series = s.latency(w.programs, n=n, budget_s=budget, validate=w.validate)
        else:
            series = s.latency(w.programs, n=n, budget_s=budget)
    except Exception as exc:
        log(f"  {w.name:14} {s.label}: FAILED to measure: {type(exc).__name__}: {exc}")
        return {"skipped": f"measurement failed: {type(exc).__name__}: {str(exc)[:300]}"}
    cell = summarize(series)
    log(f"  {w.name:14} {s.label:58} p50 {cell['p50_ms']} ms  n={cell['n']} err={cell['errors']}"
        f"  ({time.monotonic() - t0:.0f} s)")  # fmt: skip
    return cell


def measure_artifact(
    s: Subject, w: Workload, art: ArtifactBench, n: int, budget: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """Our backends only: the lifecycle call served from the ToolStore, on this subject's warm sandbox."""
    if not isinstance(s, Ours):
        return {"skipped": "no equivalent (no tool store)"}
    if s.skipped:
        return {"skipped": s.skipped}
    t0 = time.monotonic()
    try:
        run_one = art.runner(s.sandbox())
        s.refill()
        series = loops.latency(run_one, w.programs, n=n, budget_s=budget, before=s.refill)
    except Exception as exc:
        log(f"  {w.name:14} {s.label}: FAILED to measure: {type(exc).__name__}: {exc}")
        return {"skipped": f"measurement failed: {type(exc).__name__}: {str(exc)[:300]}"}
    cell = summarize(series)
    log(f"  {w.name:14} {s.label:58} p50 {cell['p50_ms']} ms  n={cell['n']} err={cell['errors']}"
        f"  ({time.monotonic() - t0:.0f} s)")  # fmt: skip
    return cell


def summarize(series: Series) -> dict[str, Any]:
    cell = series.summary()
    cell["latencies_ms"] = [round(v * 1000, 3) for v in series.latencies_s]
    return cell


def measure_throughput(s: Subject, program: Workload, seconds: float, concurrency: int,
                       log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    if s.skipped:
        return {"skipped": s.skipped}
    try:
        tp = s.throughput(program.programs[0], seconds=seconds, concurrency=concurrency)
    except Exception as exc:
        log(f"  throughput {s.label}: FAILED: {type(exc).__name__}: {exc}")
        return {"skipped": f"measurement failed: {type(exc).__name__}: {str(exc)[:300]}"}
    log(f"  throughput     {s.label:58} {tp.per_s:.1f}/s (errors {tp.errors})")
    return tp.summary()


def render(run: dict[str, Any], targets: list[report.Target]) -> str:
    parts = [
        f"== sandforge bench, {run['meta']['started_at']}: {run['meta']['nproc']} cores, "
        f"{run['meta']['memory_gb']} GB, kernel {run['meta']['kernel']}; load average (1/5/15 min) "
        f"{run['meta']['loadavg_at_start']} at start, {run['meta'].get('loadavg_at_end')} at end",
        "",
        "-- latency per execution (fresh sandbox each; * = truncated by the time budget)",
        report.latency_table(run),
        "",
        f"-- throughput, trivial program, {run['config']['throughput_seconds']:g} s wall, never-reused sandboxes",
        report.throughput_table(run),
        "",
        "-- issue 2: trivial program, cold and warm, beside the floors",
        report.issue2_table(run),
    ]
    if run.get("skipped_workloads"):
        parts += ["", *[f"skipped workload {k}: {v}" for k, v in run["skipped_workloads"].items()]]
    parts += ["", "-- targets", *[t.line() for t in targets]]
    return "\n".join(parts)
