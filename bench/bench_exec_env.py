"""What preparing a declared environment costs a program run without a model (``sandforge exec``,
``POST /v1/exec``: ``runtime.agent.program_exec.execute_program``), on warm sandboxes, per backend.

    python -m bench.bench_exec_env --wheelhouse .wheelhouse [--rounds 30] [--backends subprocess,docker]

- **no manifest**: ``execute_program`` against ``gate.guarded_execute`` (the path before issue 19's round 3)
  for a trivial program: the manifest scan and the import judgement it adds (goal: no measurable cost).
- **cache hit**: a trivial program declaring python-dateutil (environment ready, not imported) against the
  same program without the block: the environment's preparation on the request path (issue 19: at most
  50 ms added; a warm execution with it at most 1.2x without).

Samples are interleaved so load drifts hit each kind alike, ``--gap`` seconds apart so each takes a worker
waiting in its pool (warm); p50 in milliseconds, the ratios, the load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.environments import DependencyPolicy
from sandforge.runtime.gate import guarded_execute
from sandforge.runtime.guardrails import default_policy
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig

TRIVIAL = "total = 0\nfor i in range(100):\n    total += i\nreturn total\n"
DECLARED = '# /// script\n# dependencies = ["python-dateutil"]\n# ///\n' + TRIVIAL


def _p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _measure(rounds: int, kinds: dict[str, Callable[[], Any]], gap_s: float) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    for run in kinds.values():  # warm-up: pools filled, environment built, targets probed
        for _ in range(3):
            run()
    for _ in range(rounds):
        for name, run in kinds.items():
            time.sleep(gap_s)  # warm means a worker waiting in the pool: let the refill finish
            start = time.perf_counter()
            outcome = run()
            samples[name].append(time.perf_counter() - start)
            assert outcome.ok, outcome
    return {name: _p50(values) for name, values in samples.items()}


def bench_backend(backend: str, wheelhouse: Path, rounds: int, root: Path, gap_s: float) -> dict[str, Any]:
    section = {"allow": ["python-dateutil", "six", "tzdata"], "source": "offline", "wheelhouse": str(wheelhouse)}
    policy = dataclasses.replace(default_policy(), dependencies=DependencyPolicy.model_validate(section))
    envs = Environments(root / backend)
    with Sandbox(SandboxConfig(backend=backend, pool_size=2)) as sb:  # type: ignore[arg-type]

        def new(code: str) -> Callable[[], Any]:
            return lambda: execute_program(sb, ExecutionRequest(code=code), policy=policy, environments=envs)[0]

        def old() -> Any:
            return guarded_execute(sb, ExecutionRequest(code=TRIVIAL), policy=policy)[0]

        kinds = {"guarded_execute": old, "execute_program": new(TRIVIAL), "declared": new(DECLARED)}
        p50 = _measure(rounds, kinds, gap_s)
    return {
        "backend": backend,
        "p50_ms": {k: round(v, 3) for k, v in p50.items()},
        "no_manifest_ratio": round(p50["execute_program"] / p50["guarded_execute"], 3),
        "cache_hit_ratio": round(p50["declared"] / p50["execute_program"], 3),
        "cache_hit_added_ms": round(p50["declared"] - p50["execute_program"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backends", default="subprocess")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between samples (pools refill)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        backends = args.backends.split(",")
        results = [bench_backend(b, args.wheelhouse, args.rounds, Path(work), args.gap) for b in backends]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}, {args.rounds} rounds, p50 ms")
    print(f"{'backend':12} {'guarded':>9} {'exec_prog':>9} {'declared':>9}  no-manifest  cache-hit (added)")
    for r in results:
        p = r["p50_ms"]
        ratios = f"{r['no_manifest_ratio']:10.2f}x  {r['cache_hit_ratio']:.2f}x ({r['cache_hit_added_ms']:+.2f} ms)"
        times = f"{p['guarded_execute']:9.2f} {p['execute_program']:9.2f} {p['declared']:9.2f}"
        print(f"{r['backend']:12} {times}  {ratios}")
    if args.json is not None:
        args.json.write_text(json.dumps({"load": load, "rounds": args.rounds, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
