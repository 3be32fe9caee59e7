"""Dashboard page times at scale: 10,000 tools and 1,000,000 call-log records (issue 21).

    .venv/bin/python bench/bench_dashboard.py [--tools 10000] [--calls 1000000] [--dir DIR] [--repeat 15] [--out FILE]

Builds (or reuses, under ``--dir``) one tenant's state: a ToolStore of ``--tools`` tools (one method each, two
generations, a mix of healthy, degraded, stale and unproven artifacts; pattern memory for 1,000 roles) and a
call log of ``--calls`` records spread over the last 30 days (8% failures). The store files are the store's own
models written directly (the store's API would rewrite the 10,000-entry registry per tool). Then, in-process
(the FastAPI app of `sandforge serve` driven by its test client, so the figure is server time plus a
sub-millisecond client), it times:

- the first page after start: the call-log index built from nothing (every line read once) and every method's
  health read once (both kept: later pages only catch up with what was appended);
- each page warm, HTML and its JSON twin: p50 and max of ``--repeat`` requests. Goal: at most 200 ms a page.

Prints a table and the load average; writes ``--out`` (default bench/results/dashboard.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
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
    paths.registry.write_text(RegistryFile(schema_version=2, tools=entries).model_dump_json(indent=2))
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
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def measure(state: Path, repeat: int, tools: int) -> dict[str, Any]:
    token = new_token()
    tenant = {"name": "bench", "state_dir": str(state), "token_hashes": [hash_token(token)]}
    config = parse_server_config({"state_dir": str(state.parent), "tenants": [tenant]}, base=state.parent)
    app = create_app(config, audit=AuditLog(None))
    results: dict[str, Any] = {}
    with TestClient(app.state.gate, base_url="https://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        t0 = time.perf_counter()
        first = c.get("/v1/dashboard/overview")
        results["first_page_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        assert first.status_code == 200, first.text
        results["indexed_calls"] = first.json()["indexed_calls"]
        results["tool_count"] = first.json()["tools"]
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
    return results


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
    if not args.keep_index:
        for stale in state.glob("logs/calls.index.sqlite*"):
            stale.unlink()  # the first page builds the index from nothing
    load_before = os.getloadavg()
    results = measure(state, args.repeat, args.tools)
    results["load_average"] = {"before": [round(x, 2) for x in load_before],
                               "after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    results["log_bytes"] = (state / "logs" / "calls.jsonl").stat().st_size
    print(f"{'page':34} {'html p50':>9} {'max':>7} {'json p50':>9} {'max':>7}   (ms; goal <= 200)")
    for name, r in results.items():
        if isinstance(r, dict) and "html" in r:
            h, j = r["html"], r["json"]
            print(f"{name:34} {h['p50_ms']:9.1f} {h['max_ms']:7.1f} {j['p50_ms']:9.1f} {j['max_ms']:7.1f}")
    built = f"index {results['indexed_calls']} records from nothing"
    what = "index kept from an earlier run" if args.keep_index else built
    print(f"first page ({what} + every method's health): "
          f"{results['first_page_ms'] / 1000:.1f} s; tools {results['tool_count']}; load {results['load_average']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
