"""Machine CPU of one cold gVisor sandbox (start, one trivial execution, end), against a bare container of the
same image measured in the same run (issue 39, item 7: the suite's gVisor starts were its largest CPU cost).

    python -m bench.bench_sandbox_cpu [-n 6] [--rounds 2] [--backends runsc,gvisor] [--base OLD_TREE] [--out F]

Per backend, each subject runs ``n`` executions of ``return 1 + 1`` with no warm pool (every execution starts
its own sandbox), in rounds that interleave the subjects so load swings hit all alike:

- ``floor``: a bare container of the sandbox image running ``python3 -I -S -c pass`` (``runsc run`` of the
  same OCI spec for runsc; ``docker run --runtime=runsc`` for gvisor): the runtime's own cost, which no change
  to the runner can remove;
- ``B`` (this tree) and, with ``--base``, ``A`` (an old tree), each in a measuring process of its own that
  imports only the public API.

CPU per execution, four ways: ``tree``, the measuring process and every descendant it reaped (for runsc:
``runsc run``, the gofer and the sentry; a lower bound, since the sentry's stub processes, where the guest's
own code runs, are not reaped through them: docs/benchmarks.md has the cgroup and ``perf stat`` cross-checks);
``containers``, the Docker cgroup
(gvisor: the sandbox runs under containerd, not under us; every container of the engine counts, so it is
exact only on an otherwise idle engine); ``engine``, dockerd's and containerd's (a lower bound: shims that
exited are not in it); ``busy``, the whole machine's busy time from ``/proc/stat``, exact on a
quiet machine and saturated (about 2x the wall time on 2 cores) on a busy one. The load average is printed:
quote ratios measured side by side, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_percall import Tree
from bench.stats import percentile

DOCKER_CGROUP = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")

#: One tree's measuring process: only the public API. Answers each "n" line with the batch's wall samples and
#: its own CPU plus its reaped descendants' (it waits until every runtime process it started has been reaped).
WORKER = r"""
import json, os, resource, sys, time
import psutil
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig

def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

def reaped():
    deadline = time.monotonic() + 60
    while psutil.Process().children() and time.monotonic() < deadline:
        time.sleep(0.05)

sb = Sandbox(SandboxConfig(backend=sys.argv[1], pool_size=0))
out = sb.execute(ExecutionRequest(code="return 1 + 1"))  # warm-up: the backend's one-off checks
if not out.ok or out.value != 2:
    raise SystemExit(f"{sys.argv[1]}: {out.error_type}: {out.error_message}")
reaped()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    wall, c0 = [], cpu()
    for _ in range(int(line)):
        began = time.perf_counter()
        out = sb.execute(ExecutionRequest(code="return 1 + 1"))
        wall.append((time.perf_counter() - began) * 1000)
        if not out.ok or out.value != 2:
            raise SystemExit(f"{sys.argv[1]}: {out.error_type}: {out.error_message}")
    reaped()
    print(json.dumps({"wall_ms": wall, "tree_s": cpu() - c0}), flush=True)
sb.close()
"""


def _busy_s() -> float:
    """The machine's busy time so far (every CPU, all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _containers_s() -> float:
    try:
        return int(DOCKER_CGROUP.read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


#: The Docker engine's processes (gvisor): their CPU so far, summed from ``/proc`` (shims that already exited
#: are not in it, so this is a lower bound).
ENGINE = ("dockerd", "containerd", "containerd-shim-runc-v2", "containerd-shim")


def _engine() -> dict[int, float]:
    """CPU so far of each Docker engine process, by pid."""
    out: dict[int, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name in ENGINE:
            out[int(proc.name)] = sum(int(x) for x in rest[11:15]) / os.sysconf("SC_CLK_TCK")
    return out


def _engine_since(before: dict[int, float]) -> float:
    """The engine's CPU since ``before``: processes still there, and new ones (a lower bound: see ENGINE)."""
    return sum(max(cpu - before.get(pid, 0.0), 0.0) for pid, cpu in _engine().items())


def _children_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Floor:
    """A bare container of the sandbox image running ``python3 -I -S -c pass``, started as the backend starts
    its sandboxes (runsc: ``runsc run`` of the same OCI spec; gvisor: a Docker container with the runsc
    runtime and no network)."""

    def __init__(self, backend: str) -> None:
        from sandforge.sandbox import image
        from sandforge.sandbox.config import SandboxConfig

        self.backend = backend
        self.config = SandboxConfig()
        self.tag = image.expected_tag(self.config.image)
        self._n = 0

    def measure(self, n: int) -> dict[str, Any]:
        """As a measuring process answers: the wall samples and this process's reaped children's CPU."""
        wall: list[float] = []
        c0 = _children_s()
        for _ in range(n):
            began = time.perf_counter()
            self._runsc() if self.backend == "runsc" else self._docker()
            wall.append((time.perf_counter() - began) * 1000)
        return {"wall_ms": wall, "tree_s": _children_s() - c0}

    def _runsc(self) -> None:
        from sandforge.sandbox import image, oci_spec
        from sandforge.sandbox.oci_runtime import RUNTIME_ENV, STATE_DIR, runtime_command
        from sandforge.sandbox.protocol import Limits

        command = runtime_command("runsc")
        assert command is not None
        self._n += 1
        cid = f"cpufloor-{os.getpid()}-{self._n}"
        bundle = STATE_DIR / "bundles" / cid
        bundle.mkdir(parents=True, mode=0o700)
        spec = oci_spec.container_spec(
            rootfs=image.oci_rootfs(self.tag), args=["/usr/bin/python3", "-I", "-S", "-c", "pass"], limits=Limits(),
            uid=self.config.sandbox_uid, gid=self.config.sandbox_gid, cgroups_path=None, memory_headroom_mb=64,
            pids_headroom=112,
        )  # fmt: skip
        (bundle / "config.json").write_text(json.dumps(spec))
        try:
            subprocess.run(
                [*command, "run", "--bundle", str(bundle), cid], env=RUNTIME_ENV, capture_output=True,
                stdin=subprocess.DEVNULL, check=True, timeout=120,
            )  # fmt: skip
        finally:
            shutil.rmtree(bundle, ignore_errors=True)

    def _docker(self) -> None:
        import docker

        client = docker.from_env()
        try:
            client.containers.run(
                self.tag, ["python3", "-I", "-S", "-c", "pass"], runtime="runsc", network_mode="none", remove=True,
                user=f"{self.config.sandbox_uid}:{self.config.sandbox_gid}", read_only=True,
            )  # fmt: skip
        finally:
            client.close()

    def close(self) -> None:
        return None


def _p50(values: list[float]) -> float:
    return round(percentile(values, 50) or 0.0, 1)


def measure(backend: str, trees: dict[str, Path], n: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of the floor and each tree on ``backend``; per subject: wall p50 and CPU per
    execution (tree, containers, machine busy)."""
    subjects: dict[str, Floor | Tree] = {
        "floor": Floor(backend),
        **{k: Tree(v, backend, worker=WORKER) for k, v in trees.items()},
    }
    totals = ("tree_s", "containers_s", "engine_s", "busy_s")
    series: dict[str, dict[str, Any]] = {k: {"wall_ms": [], **dict.fromkeys(totals, 0.0)} for k in subjects}
    for r in range(rounds):
        order = list(subjects) if r % 2 == 0 else list(reversed(subjects))
        for name in order:
            b0, d0, e0 = _busy_s(), _containers_s(), _engine()
            got = subjects[name].measure(n)
            s = series[name]
            s["wall_ms"] += got["wall_ms"]
            s["tree_s"] += got["tree_s"]
            s["containers_s"] += _containers_s() - d0
            s["engine_s"] += _engine_since(e0)
            s["busy_s"] += _busy_s() - b0
    for subject in subjects.values():
        subject.close()
    total = n * rounds
    return {
        name: {
            "wall_p50_ms": _p50(s["wall_ms"]),
            "tree_ms": round(s["tree_s"] / total * 1000, 1),
            "containers_ms": round(s["containers_s"] / total * 1000, 1),
            "engine_ms": round(s["engine_s"] / total * 1000, 1),
            "sandbox_ms": round((s["tree_s"] + s["containers_s"] + s["engine_s"]) / total * 1000, 1),
            "busy_ms": round(s["busy_s"] / total * 1000, 1),
            "executions": total,
        }
        for name, s in series.items()
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="bench/bench_sandbox_cpu.py", description=__doc__)
    p.add_argument("-n", type=int, default=6, help="executions per round and subject")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--backends", default="runsc,gvisor")
    p.add_argument("--base", type=Path, help="an old tree to measure beside this one (A)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    trees = {"B": here} if args.base is None else {"A": args.base.resolve(), "B": here}
    result: dict[str, Any] = {"n": args.n, "rounds": args.rounds, "trees": {k: str(v) for k, v in trees.items()}}
    for backend in args.backends.split(","):
        load0 = os.getloadavg()
        cells = measure(backend, trees, args.n, args.rounds)
        load1 = os.getloadavg()
        result[backend] = {"cells": cells, "loadavg": [round(load0[0], 2), round(load1[0], 2)]}
        # runsc: the tree is the whole sandbox (and the engine's numbers are other people's containers);
        # gvisor: the sandbox runs under the engine, so the three together.
        cpu = "tree_ms" if backend == "runsc" else "sandbox_ms"
        print(f"# {backend}: one cold sandbox + `return 1 + 1`, {args.n} x {args.rounds} per subject, "
              f"load {load0[0]:.2f} -> {load1[0]:.2f}; CPU per execution in ms (ratios on {cpu})")  # fmt: skip
        head = ("wall p50", 9), ("tree", 8), ("containers", 11), ("engine", 8), ("busy", 8), ("x floor", 8)
        print(f"{'subject':<10} " + " ".join(f"{title:>{width}}" for title, width in head))
        floor = cells["floor"][cpu] or float("nan")
        for name, c in cells.items():
            label = {"A": "A (old)", "B": "B (this)"}.get(name, name)
            print(f"{label:<10} {c['wall_p50_ms']:>9.1f} {c['tree_ms']:>8.1f} {c['containers_ms']:>11.1f} "
                  f"{c['engine_ms']:>8.1f} {c['busy_ms']:>8.1f} {c[cpu] / floor:>7.2f}x")  # fmt: skip
        if "A" in cells and cells["A"][cpu]:
            print(f"- B / A CPU per execution ({cpu}): {cells['B'][cpu] / cells['A'][cpu]:.2f}; "
                  f"above the floor: {(cells['B'][cpu] - floor) / (cells['A'][cpu] - floor):.2f}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
