"""A/B of ``POST /v1/exec``'s server cost: two servers (an old source tree and this one), called interleaved.

    .venv/bin/python -m bench.ab_serve --base /tmp/old-tree [--calls 300] [--gap-ms 0] [--rounds 1]

``--base`` is a checkout (``git archive REV | tar -x -C DIR``) whose ``sandforge`` package the server ``A`` runs
(``PYTHONPATH``); server ``B`` runs this tree. Each call round does, in an order that alternates between rounds,
one Python API execution (this tree, in process), one lean ``http.client`` call and one httpx call to each
server, so load swings hit both alike. Reported per server: wall p50 (lean and httpx), the added p50 over the
API's, and the server process's whole CPU over the timed calls, per call (user + system, every thread, the clean-ups and
refills the calls leave behind included: load-immune), with the load average.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.bench_serve import TRIVIAL, _LeanClient, _start
from bench.stats import percentile
from sandforge.runtime.agent.egress import StandaloneBridge
from sandforge.runtime.gate import guarded_execute
from sandforge.runtime.guardrails import default_policy
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from tests.service.serverproc import Server


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _p50(values: list[float]) -> float:
    p = percentile([v * 1000 for v in values], 50)
    assert p is not None
    return round(p, 3)


def _start_old(base: Path, root: Path) -> Server:
    """A server running the ``sandforge`` package of ``base`` (its ``PYTHONPATH`` wins over this venv's)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(base)
    try:
        return _start(root, pool_size=2, slots=4)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


class _Calls:
    """The interleaved calls: the API in process, and a lean and an httpx client per server."""

    def __init__(self, sandbox: Sandbox, servers: dict[str, Server]) -> None:
        self.sandbox = sandbox
        self.policy = default_policy()
        self.request = ExecutionRequest(code=TRIVIAL)
        self.leans = {k: _LeanClient(s) for k, s in servers.items()}
        self.clients = {k: s.client("bench") for k, s in servers.items()}
        self.steps: list[tuple[str, Callable[[], None]]] = [("api", self.api)]
        for k in servers:
            self.steps += [(f"lean {k}", self.leans[k].exec), (f"httpx {k}", functools.partial(self.httpx, k))]

    def api(self) -> None:
        bridge = StandaloneBridge.of(self.policy)
        outcome, _ = guarded_execute(self.sandbox, self.request, policy=self.policy, bridge=bridge)
        assert bridge.fetches.attach(outcome).ok

    def httpx(self, k: str) -> None:
        r = self.clients[k].post("/v1/exec", json={"code": TRIVIAL})
        assert r.status_code == 200 and r.json()["value"] == 1, r.text

    def timed(self, calls: int, gap_s: float) -> dict[str, list[float]]:
        wall: dict[str, list[float]] = {name: [] for name, _ in self.steps}
        for i in range(calls):
            for name, fn in self.steps if i % 2 == 0 else self.steps[::-1]:
                time.sleep(gap_s)
                t0 = time.perf_counter()
                fn()
                wall[name].append(time.perf_counter() - t0)
        return wall

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        for ln in self.leans.values():
            ln.close()


def run(base: Path, root: Path, calls: int, gap_s: float) -> dict[str, Any]:
    servers = {"A": _start_old(base, root / "a")}
    try:
        servers["B"] = _start(root / "b", pool_size=2, slots=4)
        procs = {k: psutil.Process(s.proc.pid) for k, s in servers.items()}
        with Sandbox(SandboxConfig.from_env(backend="subprocess", pool_size=2)) as sandbox:
            both = _Calls(sandbox, servers)
            for _ in range(20):  # warm: pools, zygotes, policy caches, connections
                for _name, fn in both.steps:
                    fn()
            start = {k: _cpu(p) for k, p in procs.items()}
            wall = both.timed(calls, gap_s)
            time.sleep(0.5)  # what each call left running (clean-ups, refills) is counted too
            cpu = {k: _cpu(p) - start[k] for k, p in procs.items()}
            both.close()
    finally:
        for server in servers.values():
            server.stop()
    p50 = {k: _p50(v) for k, v in wall.items()}
    return {
        "gap_ms": gap_s * 1000, "calls": calls, "p50_ms": p50,
        "added_p50_ms": {k: round(v - p50["api"], 3) for k, v in p50.items() if k != "api"},
        # each server's whole CPU over the timed calls (two per round; its background work included)
        "server_cpu_ms_per_call": {k: round(v * 1000 / (2 * calls), 3) for k, v in cpu.items()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-ab-serve-") as tmp:
            print(json.dumps(run(args.base.resolve(), Path(tmp), args.calls, args.gap_ms / 1000)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
