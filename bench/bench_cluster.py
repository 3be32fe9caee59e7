"""The Ray executor (issue 22): what dispatching through a local multi-node cluster costs, one run, side by side.

    python -m bench.bench_cluster [--nodes 3] [--rounds 200] [--concurrency 6] [--address ray://HOST:PORT]
                                  [--json PATH]

- **dispatch overhead**: a warm execution of the trivial program on the local executor and through the cluster
  (subprocess backend, warm pools on both sides), samples interleaved so load drifts hit both alike.
  Target: cluster p50 - local p50 <= 3 ms.
- **throughput**: executions per second with ``--concurrency`` callers, local vs cluster, same backend.
  Target: cluster / local >= 0.8 (one machine cannot show scaling; this shows the cluster costs little).
- **per-execution costs** for the scaling model of docs/deploy.md: the caller's CPU per execution through the
  cluster (the orchestrator's share), and one node's warm execution time.

Without ``--address`` it starts a local cluster (``sandforge cluster up``'s code: real ``ray start`` nodes on
127.0.0.1 with token auth) in a temporary directory and always stops it. Prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.cluster.local import LocalCluster, NodeSpec

TRIVIAL = "return 1"


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def _one(sb: Sandbox) -> float:
    t = time.perf_counter()
    outcome = sb.execute(ExecutionRequest(code=TRIVIAL))
    took = time.perf_counter() - t
    if not outcome.ok:
        raise RuntimeError(f"execution failed: {outcome.error_type}: {outcome.error_message}")
    return took


def overhead(local: Sandbox, cluster: Sandbox, rounds: int) -> dict[str, float]:
    for _ in range(10):  # warm both paths (pools, connections, actors)
        _one(local)
        _one(cluster)
    a: list[float] = []
    b: list[float] = []
    cpu0 = time.process_time()
    cluster_cpu = 0.0
    for _ in range(rounds):
        a.append(_one(local))
        c0 = time.process_time()
        b.append(_one(cluster))
        cluster_cpu += time.process_time() - c0
    _ = cpu0
    return {
        "local_p50_ms": _p50(a), "cluster_p50_ms": _p50(b), "overhead_p50_ms": _p50(b) - _p50(a),
        "caller_cpu_per_cluster_exec_ms": cluster_cpu / rounds * 1000,
    }  # fmt: skip


def throughput(sb: Sandbox, concurrency: int, total: int) -> float:
    done = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal done
        while True:
            with lock:
                if done >= total:
                    return
                done += 1
            _one(sb)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return total / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--total", type=int, default=300, help="executions per throughput measurement")
    ap.add_argument("--address", default=None, help="an existing cluster (ray://HOST:PORT); default: start one")
    ap.add_argument("--json", dest="json_path", type=Path, default=None)
    args = ap.parse_args(argv)
    cluster: LocalCluster | None = None
    address = args.address
    try:
        if address is None:
            cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="sf-bench-cluster-")))
            state = cluster.up(specs=[NodeSpec() for _ in range(args.nodes)])
            os.environ.update(cluster.env())
            address = state.address
        load_before = os.getloadavg()
        pool = max(2, args.concurrency)
        with Sandbox(SandboxConfig(backend="subprocess", pool_size=pool)) as local, \
                Sandbox(SandboxConfig(backend="subprocess", pool_size=pool, cluster=address)) as remote:  # fmt: skip
            local.pool("subprocess").wait_ready(timeout=60)
            result: dict[str, Any] = overhead(local, remote, args.rounds)
            result["local_per_s"] = throughput(local, args.concurrency, args.total)
            result["cluster_per_s"] = throughput(remote, args.concurrency, args.total)
            result["throughput_ratio"] = result["cluster_per_s"] / result["local_per_s"]
            result["nodes"] = len(remote._cluster().nodes())
        result["load_before"] = list(load_before)
        result["load_after"] = list(os.getloadavg())
        result["cpus"] = os.cpu_count()
        result["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        if cluster is not None:
            cluster.down()
    print(
        f"dispatch (trivial, warm, subprocess, {result['nodes']} nodes): local p50 {result['local_p50_ms']:.2f} ms, "
        f"cluster p50 {result['cluster_p50_ms']:.2f} ms, overhead {result['overhead_p50_ms']:.2f} ms (goal <= 3 ms)"
    )
    print(
        f"throughput ({args.concurrency} callers): local {result['local_per_s']:.0f}/s, cluster "
        f"{result['cluster_per_s']:.0f}/s, ratio {result['throughput_ratio']:.2f} (goal >= 0.8)"
    )
    print(f"caller CPU per cluster execution: {result['caller_cpu_per_cluster_exec_ms']:.2f} ms")
    print("load average before/after: " + " / ".join(
        "(" + ", ".join(f"{x:.2f}" for x in result[k]) + ")" for k in ("load_before", "load_after")))  # fmt: skip
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
