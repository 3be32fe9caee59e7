"""A/B of warm execution latency per backend: an old source tree and this one, measured interleaved.

    .venv/bin/python -m bench.ab_backends --base /tmp/old-tree [--backends runc,docker] [-n 10] [--rounds 3]

``--base`` is a checkout (``git archive REV | tar -x -C DIR`` or a worktree) whose ``sandforge`` package
process ``A`` runs (``PYTHONPATH``); process ``B`` runs this tree. Each process keeps one warm ``Sandbox`` per
backend (``pool_size=2``); every round asks both for ``-n`` timed executions of the trivial program per
backend, in an order that alternates between rounds, so load swings hit both alike. As in ``python -m
bench``, each timed call is a warm hit: the pool is full again (untimed) before it. Reported: p50 and p95
wall ms per backend and tree, and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import percentile

#: What each process runs: only the public API, which both trees have.
WORKER = """
import json, sys, time
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
boxes = {}
for line in sys.stdin:
    backend, n = json.loads(line)
    if backend not in boxes:
        boxes[backend] = Sandbox(SandboxConfig(backend=backend, pool_size=2))
        boxes[backend].execute(ExecutionRequest(code="return 1"))  # warm-up, untimed
    sb = boxes[backend]
    samples = []
    for _ in range(n):
        if not sb.pool().wait_ready(2, timeout=60.0):
            raise SystemExit(f"the {backend} pool did not refill")
        began = time.perf_counter()
        out = sb.execute(ExecutionRequest(code="return 1 + 1"))
        took = time.perf_counter() - began
        if not out.ok or out.value != 2:
            raise SystemExit(f"{backend}: {out.error_type}: {out.error_message}")
        samples.append(took * 1000)
    print(json.dumps(samples), flush=True)
for sb in boxes.values():
    sb.close()
"""


def _process(tree: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree
    )


def _ask(proc: subprocess.Popen[str], backend: str, n: int) -> list[float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps([backend, n]) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the worker stopped measuring {backend} (exit {proc.wait()})")
    samples: list[float] = json.loads(line)
    return samples


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.ab_backends", description=__doc__)
    p.add_argument("--base", type=Path, required=True, help="the old tree (process A)")
    p.add_argument("--backends", default="subprocess,docker,gvisor,runc,runsc")
    p.add_argument("-n", type=int, default=10, help="timed executions per backend, tree and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    trees = {"A": args.base.resolve(), "B": Path(__file__).resolve().parent.parent}
    procs = {name: _process(tree) for name, tree in trees.items()}
    backends = args.backends.split(",")
    samples: dict[str, dict[str, list[float]]] = {b: {"A": [], "B": []} for b in backends}
    load_start = os.getloadavg()
    try:
        for round_ in range(args.rounds):
            order = ["A", "B"] if round_ % 2 == 0 else ["B", "A"]
            for backend in backends:
                for name in order:
                    samples[backend][name] += _ask(procs[name], backend, args.n)
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    report: dict[str, Any] = {"load_start": load_start, "load_end": os.getloadavg(), "trees": {**trees}, "p": {}}
    print(f"load average {load_start[0]:.1f} at the start, {report['load_end'][0]:.1f} at the end")
    print("| backend | A p50 ms | B p50 ms | A p95 ms | B p95 ms | n per tree |\n|---|---|---|---|---|---|")
    for backend, by_tree in samples.items():
        p50 = {name: percentile(values, 50) or 0.0 for name, values in by_tree.items()}
        p95 = {name: percentile(values, 95) or 0.0 for name, values in by_tree.items()}
        report["p"][backend] = {"p50": p50, "p95": p95}
        cells = [f"{p50['A']:.1f}", f"{p50['B']:.1f}", f"{p95['A']:.1f}", f"{p95['B']:.1f}", str(len(by_tree["A"]))]
        print(f"| {backend} | {' | '.join(cells)} |")
    return report


if __name__ == "__main__":
    main()
