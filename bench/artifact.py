"""The persisted-artifact workload: a tool method stored in the ToolStore, served from it and run per call.

One timed call is ``agent.call(method, ...)`` through the real lifecycle with ``store=ToolStore(...)``: the
workspace wraps the store in ``runtime.agent.persistence.ToolStoreSource``, whose lookup reads the role's
manifest and method file, checks the code checksum and applies the selection policy; the lifecycle
validates the code with the default policy, executes it in a warm sandbox of the backend under test,
commits the context, and the store records the success (method file and registry rewritten under the
store's lock). Only our backends can run this workload: no peer has a tool store.

``python -m bench.artifact`` measures the issue's target: that call within 1.5x of the same program run
fresh through the same warm sandbox without a model (also shown: fresh with validation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loops import Failed, Result
from bench.stats import percentile
from bench.workloads import Program, Workload, program

ROLE, METHOD = "bench_counter", "bump"
ARTIFACT_CODE = """step = args[0] if args else 1
context['total'] = context.get('total', 0) + step
context['calls'] = context.get('calls', 0) + 1
return context['calls']
"""
TARGET_RATIO = 1.5


def seed_store(root: Path) -> Any:
    """A ToolStore in ``root`` holding the artifact, as a first successful generation would have left it."""
    from sandforge.runtime.agent.persistence import RUNTIME_VERSION
    from sandforge.runtime.providers.prompt import PROMPT_VERSION
    from sandforge.runtime.store import ArtifactCandidate, ToolStore, assess_cacheability

    store = ToolStore(root)
    store.record_regeneration(
        ArtifactCandidate(
            role=ROLE,
            method_name=METHOD,
            code=ARTIFACT_CODE,
            runtime_version=RUNTIME_VERSION,
            prompt_version=PROMPT_VERSION,
            cacheability=assess_cacheability(METHOD, ARTIFACT_CODE, [1]),
        )
    )
    return store


@dataclass
class ArtifactBench:
    """A temporary store holding one artifact, and the agents (one per sandbox) that call it."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sandforge-bench-store-")))
    agents: dict[int, Any] = field(default_factory=dict)
    calls: int = 0

    def __post_init__(self) -> None:
        self.store = seed_store(self.root)

    def runner(self, sandbox: Any) -> Callable[[Program], Result]:
        """The timed call for one of our sandboxes; the provider must never be asked (it has no programs)."""
        from sandforge.runtime.agent import Agent
        from sandforge.runtime.providers import ScriptedProvider

        key = id(sandbox)
        if key not in self.agents:
            self.agents[key] = Agent.for_role(
                ROLE, provider=ScriptedProvider([]), sandbox=sandbox, store=self.store, log=self.root / "calls.jsonl"
            )
        agent = self.agents[key]
        source = agent.workspace.store  # the ToolStoreSource the workspace made of the ToolStore

        def run_one(_: Program) -> Result:
            served = source.served
            outcome = agent.call(METHOD, 1)
            if source.served != served + 1 or outcome.metadata.get("program_source") != "persisted":
                raise Failed("the call was not served from the store")
            if outcome.status != "ok":
                raise Failed(f"{outcome.error_type}: {outcome.error_message}")
            return Result(True)

        return run_one

    def close(self) -> None:
        for agent in self.agents.values():
            agent.workspace.close()
        shutil.rmtree(self.root, ignore_errors=True)


def artifact_workload() -> tuple[Workload | None, ArtifactBench | None, str | None]:
    """The workload and its store, or why it cannot run in this checkout."""
    try:
        bench = ArtifactBench()
    except Exception as exc:  # the store or the lifecycle is missing or changed shape
        return None, None, f"ToolStore/lifecycle not usable here ({type(exc).__name__}: {exc})"
    work = Workload(
        "persisted_artifact",
        "persisted-artifact call: ToolStore lookup -> validate -> execute -> commit -> record_success",
        (program("return True"),),
        notes="ours only (no peer has a tool store); value checked: served from the store and status ok",
    )
    return work, bench, None


# --- the 1.5x target ----------------------------------------------------------------------------------


def _p50(samples: list[float]) -> float:
    return round((percentile(samples, 50) or 0.0) * 1000, 3)


class _SameProgram:
    """A provider without a model: answers every request with the artifact's code at once."""

    name = "same-program"

    def generate(self, request: Any) -> Any:
        from sandforge.runtime.providers import GeneratedProgram

        return GeneratedProgram(code=ARTIFACT_CODE, provider=self.name)


def compare(backend: str, n: int) -> dict[str, Any]:
    """p50 (ms) of the persisted call and of the same program run fresh, each on a warm sandbox.

    Fresh: ``Sandbox.execute`` alone (the target's baseline); with guardrail validation first; and through
    the whole lifecycle (generate -> validate -> execute -> commit -> call log, no store) with a provider
    that answers at once. The series interleave call by call (same load for each), and before every timed
    call the warm pool is refilled untimed, so each one gets a started sandbox."""
    from sandforge.runtime.agent import Agent
    from sandforge.runtime.guardrails import default_policy, validate
    from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig

    sandbox = Sandbox(SandboxConfig(backend=backend, pool_size=1))
    bench = ArtifactBench()
    lifecycle = Agent.for_role(ROLE, provider=_SameProgram(), sandbox=sandbox, log=bench.root / "fresh.jsonl")
    policy = default_policy()
    try:
        persisted = bench.runner(sandbox)
        pool = sandbox.pool()
        context: dict[str, Any] = {"total": 0, "calls": 0}

        def fresh(with_validation: bool) -> None:
            if with_validation and validate(ARTIFACT_CODE, policy).verdict != "approved":
                raise Failed("rejected")
            out = sandbox.execute(ExecutionRequest(code=ARTIFACT_CODE, context=context, args=[1]))
            if not out.ok:
                raise Failed(f"{out.error_type}: {out.error_message}")

        def fresh_lifecycle() -> None:
            out = lifecycle.call(METHOD, 1)
            if not out.ok or out.metadata.get("program_source") != "generated":
                raise Failed(f"{out.error_type}: {out.error_message}")

        runs: dict[str, Callable[[], Any]] = {
            "fresh_sandbox": lambda: fresh(False),
            "fresh_validated": lambda: fresh(True),
            "fresh_lifecycle": fresh_lifecycle,
            "persisted": lambda: persisted(program("return True")),
        }
        samples: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(2):  # untimed warm-up: engine connection, lazy imports, page cache
            for run in runs.values():
                pool.wait_ready(1, timeout=60.0)
                run()
        for _ in range(n):
            for name, run in runs.items():
                if not pool.wait_ready(1, timeout=60.0):
                    raise RuntimeError(f"the {backend} pool did not refill: {pool.last_error}")
                c0, t0 = time.thread_time(), time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
        result: dict[str, Any] = {"backend": backend, "n": n}
        result |= {f"{name}_p50_ms": _p50(values) for name, values in samples.items()}
        # CPU of the calling thread: the host-side cost, immune to preemption on a loaded machine
        result |= {f"{name}_thread_cpu_p50_ms": _p50(values) for name, values in cpu.items()}
        for base in ("fresh_sandbox", "fresh_validated", "fresh_lifecycle"):
            result[f"ratio_vs_{base}"] = round(result["persisted_p50_ms"] / result[f"{base}_p50_ms"], 3)
        result["target_met"] = result["ratio_vs_fresh_sandbox"] <= TARGET_RATIO
        return result
    finally:
        lifecycle.workspace.close()
        bench.close()
        sandbox.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.artifact", description=compare.__doc__)
    parser.add_argument("--backends", default="subprocess", help="comma-separated: subprocess,docker,gvisor")
    parser.add_argument("-n", type=int, default=50, help="timed calls per series")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        try:
            rows.append(compare(backend, args.n))
        except Exception as exc:
            rows.append({"backend": backend, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"persisted-artifact call vs the same program fresh (p50 ms, n={args.n}, load {os.getloadavg()[0]:.2f})")
    cols = ("fresh", "+validate", "lifecycle", "persisted", "ratio", "vs lifecycle")
    print(f"{'backend':<11}" + "".join(f"{c:>13}" for c in cols) + f"  target: ratio <= {TARGET_RATIO}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['backend']:<11} skipped: {r['skipped']}")
            continue
        keys = ("fresh_sandbox_p50_ms", "fresh_validated_p50_ms", "fresh_lifecycle_p50_ms", "persisted_p50_ms",
                "ratio_vs_fresh_sandbox", "ratio_vs_fresh_lifecycle")  # fmt: skip
        verdict = "met" if r["target_met"] else "MISSED"
        print(f"{r['backend']:<11}" + "".join(f"{r[k]:>13}" for k in keys) + f"  {verdict}")
        cpu = [f"{r[k.replace('_p50_ms', '_thread_cpu_p50_ms')]:>13}" for k in keys[:4]]
        print(f"{'  cpu':<11}" + "".join(cpu) + "  (calling thread's CPU, p50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
