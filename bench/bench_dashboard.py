"""Dashboard page times at scale: 10,000 tools and 1,000,000 call-log records (issue 21).

    .venv/bin/python bench/bench_dashboard.py [--tools 10000] [--calls 1000000] [--dir DIR] [--repeat 15] [--out FILE]

Builds (or reuses, under ``--dir``) one tenant's state: a ToolStore of ``--tools`` tools (one method each, two
generations, a mix of healthy, degraded, stale and unproven artifacts; pattern memory for 1,000 roles) and a
call log of ``--calls`` records spread over the last 30 days (8% failures). The store files are the store's own
models written directly (a ``registry.json``, migrated into ``registry.sqlite`` once, as an older store's would
be). Then, in-process (the FastAPI app of `sandforge serve` driven by its test client, so the figure is server
time plus a sub-millisecond client), it times:

- a fresh process on a log with no index (a build of every record runs in the background): the time to its
  first calls page and first overview (no health snapshot yet: every method's health is read once, then
  persisted, by a build in the background: the overview waits at most 0.1 s, then says "computing tool
  health: N of M tools" and is polled until it is done), what the pages say ("indexing: N of about M
  records"), and how long each build took;
- a fresh process on the same state (index and health snapshot present): its first overview, then its first
  tools page (every tool's row) and first artifact page (each "fresh process" is a new interpreter);
- the same after another process recorded one call's outcome (the registry changed since the snapshot: the
  board is taken with the one row written since computed again);
- a fresh process with the health snapshot but no index: its first overview while the build runs;
- each page warm, HTML and its JSON twin: p50, p95 and max of ``--repeat`` requests. Goal: at most 200 ms a page.

Prints a table and the load average; writes ``--out`` (default bench/results/dashboard.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient

from sandforge.runtime.agent.calllog import CallRecord
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.fingerprint import code_checksum
from sandforge.runtime.store.models import (
    MethodArtifact,
    MethodFile,
    PatternEvent,
    PatternsFile,
    RegistryEntry,
    RegistryFile,
    RoleManifest,
    RolePatterns,
    ToolContract,
)
from sandforge.runtime.store.paths import StorePaths, safe_component

ERROR_TYPES = ["execution_error", "timeout", "guardrail_violation", "egress_denied", "provider", "adaptive_failure"]
STAGES = ["execution", "execution", "validation", "execution", "generation", "outcome_policy"]
CODE = "total = 0\nfor x in args:\n    total += x\ncontext['n'] = context.get('n', 0) + 1\nreturn total * {k}\n"


def _artifact(role: str, generation: int, now: datetime, kind: str, fingerprint: str) -> MethodArtifact:
    code = CODE.format(k=generation)
    degraded = kind == "degraded"
    return MethodArtifact(
        role=role, method_name="run_job", generation=generation, code=code, prompt_version="p1-old" if kind == "stale"
        else PROMPT_VERSION, runtime_version="0.1.0", code_checksum=code_checksum(code),
        contract_fingerprint=fingerprint, cacheable=True, cacheability_reason="stable_method",
        success_count=0 if kind == "unproven" else 40, failure_count=6 if degraded else 1,
        intrinsic_failure_count=5 if degraded else 0, extrinsic_failure_count=1,
        recent_failure_rate=0.3 if degraded else 0.0,
        recent_outcomes=[True] * 14 + [False] * 6 if degraded else [True] * 20,
        consecutive_intrinsic_failures=2 if degraded else 0, created_at=now - timedelta(days=3 - generation),
        last_used_at=now,
    )  # fmt: skip


def build_store(state: Path, tools: int, rng: random.Random) -> None:
    paths = StorePaths(state)
    paths.tools.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.now(UTC)
    entries: dict[str, RegistryEntry] = {}
    for i in range(tools):
        role = f"tool_{i:05d}"
        contract = ToolContract(role=role, purpose=f"does job number {i} for the fleet", deliverable={"type": "number"})
        fp = contract.fingerprint()
        kind = rng.choices(["healthy", "degraded", "stale", "unproven"], [85, 5, 5, 5])[0]
        current, previous = _artifact(role, 2, now, kind, fp), _artifact(role, 1, now, "healthy", fp)
        role_dir = paths.role_dir(role)
        role_dir.mkdir(exist_ok=True, mode=0o700)
        mf = MethodFile(schema_version=2, role=role, method_name="run_job", next_generation=3, current=current,
                        history=[previous])  # fmt: skip
        paths.method_file(role, "run_job").write_text(mf.model_dump_json(indent=2))
        manifest = RoleManifest(schema_version=2, role=role, contract=contract, created_at=now, updated_at=now,
                                methods={"run_job": paths.method_file_name("run_job")})  # fmt: skip
        paths.manifest(role).write_text(manifest.model_dump_json(indent=2))
        uses = rng.randint(1, 5000)
        entries[role] = RegistryEntry(
            role=role, purpose=contract.purpose, deliverable=contract.deliverable, contract_fingerprint=fp,
            created_at=now - timedelta(days=30), updated_at=now,
            last_used_at=now - timedelta(minutes=rng.randint(0, 9999)),
            usage_count=uses, success_count=uses - uses // 20, failure_count=uses // 20, methods=["run_job"],
            dir_name=safe_component(role),
        )  # fmt: skip
    paths.legacy_registry.write_text(RegistryFile(schema_version=2, tools=entries).model_dump_json(indent=2))
    ToolStore(state).list_tools()  # registry.json migrated into registry.sqlite here, not in a measured page
    events = {
        f"tool_{i:05d}": RolePatterns(events=[
            PatternEvent(timestamp=now - timedelta(minutes=k), method_name="run", capability_patterns=["http_fetch"])
            for k in range(10)
        ]) for i in range(min(1000, tools))
    }  # fmt: skip
    paths.patterns.write_text(PatternsFile(schema_version=1, roles=events).model_dump_json())


def _template() -> dict[str, Any]:
    record = CallRecord(
        trace_id="t" * 32, call_id="c" * 16, depth=0, role="tool_00000", method="run_job", args=[1, 2, 3],
        kwargs={}, started_at=datetime.now(UTC), duration_s=0.05, program_source="persisted",
        program_code=CODE.format(k=2), program_sha256="0" * 64, status="ok", value=6, attempt_id="a" * 16, attempts=1,
        attempt_stage="executed", verdict="approved", policy_fingerprint="f" * 16, backend="subprocess",
        artifact_hit=True, artifact_generation=2, selection_decision="execute_persisted", selection_reason="healthy",
        cacheable=True, cacheability_reason="stable_method", store_actions=["record_success@2"],
    )  # fmt: skip
    return json.loads(record.model_dump_json())


def build_log(path: Path, calls: int, tools: int, rng: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    base = _template()
    now = time.time()
    span = 30 * 86400
    with path.open("w", encoding="utf-8") as out:
        for i in range(calls):
            rec = dict(base)
            started = now - span + span * i / calls
            rec["started_at"] = datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z")
            rec["trace_id"] = f"{i:032x}"
            rec["call_id"] = f"{i:016x}"
            rec["role"] = f"tool_{rng.randrange(tools):05d}"
            rec["duration_s"] = round(rng.uniform(0.01, 0.4), 4)
            if rng.random() < 0.08:
                k = rng.randrange(len(ERROR_TYPES))
                rec.update(status="error", value=None, error_type=ERROR_TYPES[k], latest_failure_stage=STAGES[k],
                           error_message="the program failed", failure_class="intrinsic", attempts=2)  # fmt: skip
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")


def _time(client: TestClient, url: str, repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url}: {response.status_code} {response.text[:200]}")
    p95 = statistics.quantiles(times, n=20, method="inclusive")[-1] if len(times) > 1 else times[0]
    return {"p50_ms": round(statistics.median(times), 1), "p95_ms": round(p95, 1), "max_ms": round(max(times), 1)}


def _app(state: Path) -> tuple[Any, str]:
    token = new_token()
    tenant = {"name": "bench", "state_dir": str(state), "token_hashes": [hash_token(token)]}
    config = parse_server_config({"state_dir": str(state.parent), "tenants": [tenant]}, base=state.parent)
    return create_app(config, audit=AuditLog(None)), token


def _get(c: TestClient, url: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    response = c.get(url)
    took = round((time.perf_counter() - t0) * 1000, 1)
    if response.status_code != 200:
        raise SystemExit(f"{url}: {response.status_code} {response.text[:200]}")
    return took, response.json()


def _await_health(c: TestClient, first: dict[str, Any], started: tuple[float, float], out: dict[str, Any]) -> None:
    """When the first overview said "computing tool health" (no board or health snapshot yet: the build of
    every method's health runs in the background), what it said, and the overview polled until it is done:
    the build's duration from the first overview's request, and the overview's time meanwhile. ``started``:
    when the process's first page and its first overview were asked for (an index build that ends meanwhile
    is timed from the first)."""
    out["health_building_at_first_overview"] = first.get("health_building")
    if first.get("health_building") is None:
        return
    during = []
    while (now := _get(c, "/v1/dashboard/overview"))[1].get("health_building") is not None:
        during.append(now[0])
        if now[1]["indexing"] is None and "index_caught_up_s" not in out:
            out["index_caught_up_s"] = round(time.perf_counter() - started[0], 1)
        time.sleep(0.2)
    out["health_build_s"] = round(time.perf_counter() - started[1], 2)
    out["overview_during_health_build_p50_ms"] = round(statistics.median(during), 1) if during else None
    out["tool_count"] = now[1]["tools"]


def _drop(state: Path, index: bool, snapshot: bool) -> None:
    patterns = (["logs/calls.index.sqlite*"] if index else []) + (["logs/dashboard-health.sqlite*"] if snapshot else [])
    for pattern in patterns:
        for stale in state.glob(pattern):
            stale.unlink()


def fresh_process(
    state: Path, *, drop_index: bool, drop_snapshot: bool, wait_build: bool, write: bool = False
) -> dict[str, Any]:
    """A new app (new store objects, boards, caches: what a new process has) on ``state``; with ``write``,
    after one call's outcome was recorded by another process (the registry's bytes changed since the
    persisted board: the first pages decode it again)."""
    _drop(state, drop_index, drop_snapshot)
    if write:
        ToolStore(state).record_success("tool_00001", "run_job")
    app, token = _app(state)
    out: dict[str, Any] = {}
    with TestClient(app.state.gate, base_url="https://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        started = time.perf_counter()
        out["first_calls_page_ms"], calls = _get(c, "/v1/dashboard/calls")
        overview_started = time.perf_counter()
        out["first_overview_ms"], overview = _get(c, "/v1/dashboard/overview")
        out["indexing_at_first_page"] = calls["indexing"]
        out["indexed_at_overview"] = overview["indexed_calls"]
        out["tool_count"] = out["tools_at_first_overview"] = overview["tools"]
        _await_health(c, overview, (started, overview_started), out)
        out["second_overview_ms"], _ = _get(c, "/v1/dashboard/overview")
        if not wait_build:  # the pages that read every tool's row and one artifact, each the first of its kind
            out["first_tools_page_ms"], tools = _get(c, "/v1/dashboard/tools?sort=usage&order=desc")
            role, method = tools["tools"][0]["role"], tools["tools"][0]["methods"][0]["method"]
            out["first_artifact_ms"], _ = _get(c, f"/v1/dashboard/tools/{role}/{method}")
        if wait_build:
            during = []
            while (state_now := _get(c, "/v1/dashboard/calls"))[1]["indexing"] is not None:
                during.append(state_now[0])
                time.sleep(1.0)
            out["build_s"] = out.pop("index_caught_up_s", None) or round(time.perf_counter() - started, 1)
            out["calls_page_during_build_p50_ms"] = round(statistics.median(during), 1) if during else None
            out["indexed_calls"] = _get(c, "/v1/dashboard/overview")[1]["indexed_calls"]
    app.state.dashboard.close()  # stops a build still running after its batch: the next process resumes it
    return out


def in_new_process(state: Path, **how: bool) -> dict[str, Any]:
    """:func:`fresh_process` in a new interpreter (its own hash seed, no module-level cache of this one)."""
    script = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\nfrom bench_dashboard import fresh_process\n"
        f"print(json.dumps(fresh_process(Path({str(state)!r}), **{how!r})))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def measure(state: Path, repeat: int, tools: int, keep_index: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "cold": in_new_process(state, drop_index=not keep_index, drop_snapshot=True, wait_build=True),
        "fresh": in_new_process(state, drop_index=False, drop_snapshot=False, wait_build=False),
    }
    app, token = _app(state)
    with TestClient(app.state.gate, base_url="https://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        results["indexed_calls"] = _get(c, "/v1/dashboard/overview")[1]["indexed_calls"]
        call_id = c.get("/v1/dashboard/calls").json()["calls"][0]["call_id"]
        c.post("/dashboard/login", data={"token": token})
        pages = {
            "overview": "/dashboard",
            "tools": "/dashboard/tools",
            "tools sorted by failure rate": "/dashboard/tools?sort=failure_rate&order=desc",
            "tools filtered (degraded, text)": "/dashboard/tools?badge=degraded&q=tool_0",
            "tools page 150": "/dashboard/tools?page=150",
            "artifact (diff)": f"/dashboard/tools/tool_{tools * 42 // 100:05d}/run_job",
            "calls": "/dashboard/calls",
            "calls role+status": f"/dashboard/calls?role=tool_{tools // 3:05d}&status=error",
            "calls stage, last 24h": "/dashboard/calls?stage=execution&since=24h",
            "calls deep page": f"/dashboard/calls?before={results['indexed_calls'] // 2}",
            "call": f"/dashboard/calls/{call_id}",
            "patterns": "/dashboard/patterns",
        }
        for name, url in pages.items():
            html = _time(c, url, repeat)
            twin = _time(c, url + ("&" if "?" in url else "?") + "format=json", repeat)
            results[name] = {"html": html, "json": twin}
    app.state.dashboard.close()
    # after the warm pages: another process's write moves the registry's sequence past the board's
    results["fresh_after_write"] = in_new_process(state, drop_index=False, drop_snapshot=False, wait_build=False,
                                                  write=True)  # fmt: skip
    if not keep_index:  # last: a fresh process (snapshot kept) while the whole build runs again
        results["fresh_during_build"] = in_new_process(state, drop_index=True, drop_snapshot=False, wait_build=False)
    return results


def _report(results: dict[str, Any]) -> None:
    head = f"{'html p50':>9} {'p95':>7} {'max':>7} {'json p50':>9} {'p95':>7} {'max':>7}"
    print(f"{'page':34} {head}   (ms; goal <= 200)")
    for name, r in results.items():
        if isinstance(r, dict) and "html" in r:
            h, j = r["html"], r["json"]
            print(f"{name:34} {h['p50_ms']:9.1f} {h['p95_ms']:7.1f} {h['max_ms']:7.1f} "
                  f"{j['p50_ms']:9.1f} {j['p95_ms']:7.1f} {j['max_ms']:7.1f}")  # fmt: skip
    cold, fresh = results["cold"], results["fresh"]
    ix = cold["indexing_at_first_page"]
    said = "index already complete" if not ix else "indexing: just started"
    if ix and ix["indexed_records"]:
        said = f"indexing: {ix['indexed_records']} of about {ix['estimated_records']} records"
    hb = cold.get("health_building_at_first_overview")
    health = "health computed within the page's wait" if hb is None else (
        f"it said: computing tool health: {hb['done']} of {hb['total']} tools, "
        f"tools {cold['tools_at_first_overview']}; the health build took "
        f"{cold['health_build_s']} s in the background, overview p50 {cold['overview_during_health_build_p50_ms']} ms "
        "meanwhile")  # fmt: skip
    print(f"no index, no snapshot: first calls page {cold['first_calls_page_ms']:.1f} ms ({said}); first overview "
          f"{cold['first_overview_ms']:.1f} ms ({health}); "
          f"then {cold['second_overview_ms']:.1f} ms; build of {cold.get('indexed_calls')} records "
          f"{cold.get('build_s')} s in the background "
          f"(calls page p50 {cold.get('calls_page_during_build_p50_ms')} ms meanwhile)")  # fmt: skip
    print(
        f"fresh process, index + snapshot: first overview {fresh['first_overview_ms']:.1f} ms "
        f"(tools {fresh['tool_count']}), first calls page {fresh['first_calls_page_ms']:.1f} ms, "
        f"then first tools page {fresh['first_tools_page_ms']:.1f} ms, "
        f"first artifact {fresh['first_artifact_ms']:.1f} ms"
    )
    w = results["fresh_after_write"]
    print(
        f"fresh process, a call recorded since the snapshot: first overview {w['first_overview_ms']:.1f} ms, "
        f"first tools page {w['first_tools_page_ms']:.1f} ms, first artifact {w['first_artifact_ms']:.1f} ms"
    )
    if "fresh_during_build" in results:
        d = results["fresh_during_build"]
        print(
            f"fresh process, snapshot, index building: first calls page {d['first_calls_page_ms']:.1f} ms, first "
            f"overview {d['first_overview_ms']:.1f} ms ({d['indexed_at_overview']} records indexed by then)"
        )
    print(f"load {results['load_average']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sandforge-bench-dashboard"))
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--keep-index", action="store_true", help="reuse the call-log index of an earlier run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dashboard.json")
    args = parser.parse_args()
    state = args.dir / f"t{args.tools}-c{args.calls}"
    rng = random.Random(21)
    if not (state / "logs" / "calls.jsonl").exists():
        t0 = time.perf_counter()
        build_store(state, args.tools, rng)
        build_log(state / "logs" / "calls.jsonl", args.calls, args.tools, rng)
        took = time.perf_counter() - t0
        print(f"built {args.tools} tools and {args.calls} call records in {took:.0f} s", file=sys.stderr)
    t0 = time.perf_counter()
    ToolStore(state).list_tools()  # a state built by an older bench: its registry.json migrated now, unmeasured
    print(f"registry read (or migrated) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    load_before = os.getloadavg()
    results = measure(state, args.repeat, args.tools, args.keep_index)
    results["load_average"] = {"before": [round(x, 2) for x in load_before],
                               "after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    results["log_bytes"] = (state / "logs" / "calls.jsonl").stat().st_size
    _report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
