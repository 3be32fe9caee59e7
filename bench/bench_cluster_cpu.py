"""Where a local test cluster's CPU goes (issue 22): per process class, idle and per execution.

    python bench/bench_cluster_cpu.py [--nodes 3] [--concurrency 6] [--total 600] [--idle-s 10] [--address ADDR]

Starts a local cluster (``sandforge cluster up``'s code) unless ``--address`` names one (then
``SANDFORGE_CLUSTER_DIR`` must be its directory, to find its processes), then measures the CPU (user + system)
of every process of the cluster, by class (gcs_server, raylet, each agent, log monitors, the autoscaler's
monitor, Ray Client's server, the sandbox-host actors, idle Ray workers, the sandboxes the hosts start) and
of this caller process:

- idle with no caller connected, and idle with the hosts created and their pools full (ms of CPU per second);
- during a throughput phase of ``--concurrency`` callers (ms of CPU per execution), beside the same phase on
  the local executor (this process and its sandboxes), so the cluster's extra CPU per execution is measured
  directly: on 2 cores the throughput ratio is about local CPU per execution / cluster CPU per execution.

Run as a script path so that another checkout's ``sandforge`` can be measured with the same harness (A/B).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.cluster.local import LocalCluster, NodeSpec

_SCRIPTS = (("log_monitor.py", "log_monitor"), ("autoscaler/_private/monitor.py", "autoscaler_monitor"),
            ("client.server", "client_server"), ("dashboard.py", "dashboard_head"))  # fmt: skip


def _class(proc: psutil.Process) -> str:
    try:
        name = proc.name()
        if name in ("python", "python3") or name.startswith("python"):
            line = " ".join(proc.cmdline())
            for mark, label in _SCRIPTS:
                if mark in line:
                    return label
            return "python(other)"
        if name.startswith("ray::SandboxHost"):
            return "host_actor"
        if name.startswith("ray::IDLE") or name == "ray::IDLE":
            return "ray_idle_worker"
        return name
    except psutil.Error:
        return "gone"


def _times(proc: psutil.Process) -> tuple[float, float]:
    try:
        t = proc.cpu_times()
        return t.user + t.system, t.children_user + t.children_system
    except psutil.Error:
        return 0.0, 0.0


class Meter:
    """CPU of a set of processes (and their reaped children) between ``start`` and ``stop``."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.before = {p.pid: (p, _class(p), _times(p)) for p in self.procs}
        inside = {c.pid for p, label, _ in self.before.values() if label == "host_actor" for c in _descendants(p)}
        self.before = {pid: row for pid, row in self.before.items() if pid not in inside}  # sandboxes: below
        self.live0 = self._live_children()

    def _live_children(self) -> float:
        """The CPU so far of the sandboxes the hosts run right now (not yet reaped)."""
        return sum(live_cpu(proc) for proc, label, _ in self.before.values() if label == "host_actor")

    def stop(self) -> tuple[dict[str, float], float]:
        wall = time.perf_counter() - self.t0
        by: collections.Counter[str] = collections.Counter()
        for proc, label, (own, kids) in self.before.values():
            own2, kids2 = _times(proc)
            if own2 == 0.0 and kids2 == 0.0:
                continue
            by[label] += own2 - own
            if kids2 - kids:
                by["sandboxes" if label == "host_actor" else f"{label}(children)"] += kids2 - kids
        # reaped during the window: counted whole in the hosts' children times, minus what they used before it
        by["sandboxes"] += self._live_children() - self.live0
        return dict(by), wall


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def live_cpu(proc: psutil.Process) -> float:
    """CPU so far of ``proc``'s live children (and what they reaped): its sandboxes not yet reaped."""
    total = 0.0
    try:
        children = proc.children()
    except psutil.Error:
        return 0.0
    for child in children:
        try:
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system + live_cpu(child)
        except psutil.Error:
            continue
    return total


def _self_cpu() -> tuple[float, float]:
    """This process's own CPU, and its sandboxes' (reaped, and live ones so far)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system + live_cpu(psutil.Process())


def _add_caller(table: dict[str, float], start: tuple[float, float]) -> None:
    own, kids = _self_cpu()
    table["caller"] = own - start[0]
    table["caller_sandboxes"] = kids - start[1]


def _run(sb: Sandbox, concurrency: int, total: int) -> float:
    done = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal done
        while True:
            with lock:
                if done >= total:
                    return
                done += 1
            outcome = sb.execute(ExecutionRequest(code="return 1"))
            if not outcome.ok:
                raise RuntimeError(f"{outcome.error_type}: {outcome.error_message}")

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return total / (time.perf_counter() - t)


def measure(cluster: LocalCluster, address: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": list(os.getloadavg())}
    meter = Meter(cluster.processes())
    meter.start()
    time.sleep(args.idle_s)
    idle, wall = meter.stop()
    out["idle_no_caller_ms_per_s"] = {k: v / wall * 1000 for k, v in idle.items()}
    pool = max(2, args.concurrency)
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=pool)) as local, \
            Sandbox(SandboxConfig(backend="subprocess", pool_size=pool, cluster=address)) as remote:  # fmt: skip
        import ray

        for _ in range(20):
            local.execute(ExecutionRequest(code="return 1"))
            remote.execute(ExecutionRequest(code="return 1"))
        nodes = remote._cluster().nodes()
        ray.get([n.actor.refill.remote("subprocess") for n in nodes])
        local.pool("subprocess").wait_ready(timeout=60)
        time.sleep(1.0)
        meter = Meter(cluster.processes())
        meter.start()
        c0 = _self_cpu()  # after the meter's own work (it lists every process)
        time.sleep(args.idle_s)
        _add_caller(idle := {}, c0)
        used, wall = meter.stop()
        idle.update(used)
        out["idle_with_hosts_ms_per_s"] = {k: v / wall * 1000 for k, v in idle.items()}
        rates: dict[str, list[float]] = {"local": [], "cluster": []}
        cpu: dict[str, collections.Counter[str]] = {"local": collections.Counter(), "cluster": collections.Counter()}
        counts = {"local": 0, "cluster": 0}
        for rep in range(args.reps):
            order = ("local", "cluster") if rep % 2 == 0 else ("cluster", "local")
            for which in order:
                sb = local if which == "local" else remote
                local.pool("subprocess").wait_ready(timeout=60)
                ray.get([n.actor.refill.remote("subprocess") for n in nodes])
                meter = Meter(cluster.processes())
                meter.start()
                c0 = _self_cpu()
                rates[which].append(_run(sb, args.concurrency, args.total))
                local.pool("subprocess").wait_ready(timeout=60)  # the refill it caused is its cost
                ray.get([n.actor.refill.remote("subprocess") for n in nodes])
                _add_caller(used := {}, c0)
                more, _ = meter.stop()
                used.update(more)
                cpu[which].update(used)
                counts[which] += args.total
        for which in ("local", "cluster"):
            out[f"{which}_per_s"] = rates[which]
            out[f"{which}_cpu_ms_per_exec"] = {k: v / counts[which] * 1000 for k, v in cpu[which].items()}
    out["ratio"] = sum(out["cluster_per_s"]) / sum(out["local_per_s"])
    out["load_after"] = list(os.getloadavg())
    return out


def _show(title: str, table: dict[str, float], unit: str) -> None:
    rows = sorted(((k, v) for k, v in table.items() if abs(v) >= 0.005), key=lambda kv: -kv[1])
    print(f"{title}: total {sum(table.values()):.2f} {unit}")
    for k, v in rows:
        print(f"    {k:26s} {v:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--total", type=int, default=300)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--json", dest="json_path", type=Path, default=None)
    args = ap.parse_args()
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="sf-cpu-cluster-")))
    try:
        state = cluster.up(specs=[NodeSpec() for _ in range(args.nodes)])
        os.environ.update(cluster.env())
        time.sleep(3.0)
        result = measure(cluster, state.gcs_address, args)
    finally:
        cluster.down()
    _show("idle, no caller (ms CPU per s)", result["idle_no_caller_ms_per_s"], "ms/s")
    _show("idle, hosts up, pools full (ms CPU per s)", result["idle_with_hosts_ms_per_s"], "ms/s")
    _show("local executor (ms CPU per execution)", result["local_cpu_ms_per_exec"], "ms/exec")
    _show("cluster (ms CPU per execution)", result["cluster_cpu_ms_per_exec"], "ms/exec")
    print(f"throughput local {result['local_per_s']} cluster {result['cluster_per_s']} ratio {result['ratio']:.2f}")
    print(f"load before {result['load_before']} after {result['load_after']}")
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
