"""A warm run of a program that declares packages against the same run of a program with none (issue 39 item 3):
environment zygotes (``sandbox/envzygotes.py``) pre-import the environment, so the goal is at most 1.5x.

    python -m bench.bench_env_pool [--module pandas] [--rounds 20] [--gap 0.5] [--json out.json]
    python -m bench.bench_env_pool --module dateutil --requirements python-dateutil \\
        --allow python-dateutil,six --source offline --wheelhouse .wheelhouse    # a lighter package, offline

Side by side in one run, on subprocess, interleaved so load drifts hit each alike, ``--gap`` seconds apart so
each takes a worker waiting in its pool (warm):

- **floor**: ``return sum([1, 2, 3])`` with no environment;
- **measured**: the package program (pandas: build a DataFrame and sum a column) in its environment, workers
  forked from the environment's zygote (``env_zygotes_max=2``, the default; confined before its import);
- **env, no import**: the floor's program in the same environment (what mounting it costs, without the
  package's own work);
- **env, plain**: the floor's program in the environment, forked from the plain zygote (the mount's own cost:
  "env, no import" minus this is what forking from a zygote holding the packages costs);
- **before**: the same package program with no environment zygote (``env_zygotes_max=0``): the runner imports
  the package on every run, as before this change.

Also the cold first run (environment zygote built: the import, once) and each subject's runner CPU. The
environment is built (or found) in ``--store`` first, from the package index or a wheelhouse. Prints p50 /
p90 in ms, measured / floor / goal with the load average.

And the bare fork floor, in the same rounds: with no sandbox at all, a process that imported the package and
ran the program's work once (as a zygote does) forks a child, which runs the work once more while it waits
(as a runner re-warms in its pool), then on a signal runs it and exits; the same with a plain interpreter and
the floor's program. Their difference is what holding the package costs a fresh process (its first writes to
the shared heap, and its exit tearing down an address space of the package's size), whatever the sandbox does;
the sandbox waits for that exit (an ok result stands only with the clean exit after it: docs/security.md), so
no warm run of the package program can take less than the floor plus that difference. Printed as the
reachable floor and its ratio to the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.environments.target import probe
from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Sandbox, SandboxConfig

GOAL = 1.5
#: The goal proposed where ``GOAL`` is below the floor (issue 39, blocked): measured at most this much above the
#: reachable floor printed in the same run (docs/benchmarks.md, "Round 8").
PROPOSED_TO_REACHABLE = 1.15
FLOOR_CODE = "return sum([1, 2, 3])\n"
CODE = {
    "pandas": 'import pandas\nframe = pandas.DataFrame({"a": [1, 2, 3]})\nreturn int(frame["a"].sum())\n',
}
PANDAS_ALLOW = "numpy,pandas,python-dateutil,six,tzdata,pytz"
DEFAULT_STORE = Path.home() / ".cache" / "sandforge" / "bench" / "envs"
#: How long a bare child waits before its signal, like a warm worker in its pool (its fork not timed).
BARE_WAIT_S = 0.05
#: The bare fork floor's process: ``site module body``; one timed fork per line read, its ms printed.
BARE_FORKS = r"""
import gc, os, sys, time
site, module, body = sys.argv[1:4]
if site:
    sys.path.insert(0, site)
namespace = {}
exec("def work():\n" + "".join("    " + line + "\n" for line in body.splitlines()), namespace)
work = namespace["work"]
if module:
    __import__(module)
    work()
gc.freeze()
for _ in sys.stdin:
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        if module:
            work()
        os.read(go_r, 1)
        work()
        os._exit(0)
    os.close(go_r)
    time.sleep(float(sys.argv[4]))
    began = time.perf_counter()
    os.write(go_w, b"g")
    _, _, usage = os.wait4(pid, 0)
    took = time.perf_counter() - began
    os.close(go_w)
    print(f"{took * 1000:.4f} {(usage.ru_utime + usage.ru_stime) * 1000:.4f}", flush=True)
"""


class BareForks:
    """The bare fork floor's process (``BARE_FORKS``): ``sample()`` times one child's work and exit after its
    signal (wall ms) and gives its whole CPU (ms, its re-warm included, as a runner's is)."""

    def __init__(self, site: str, module: str, body: str) -> None:
        argv = [sys.executable, "-I", "-c", BARE_FORKS, site, module, body, str(BARE_WAIT_S)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)  # fmt: skip

    def sample(self) -> tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: its last words are read below
        line = self.proc.stdout.readline().split()
        if len(line) != 2:
            self.proc.wait(timeout=30)
            words = (self.proc.stderr.read().strip().splitlines() or ["no reason given"])[-1]
            raise SystemExit(f"the bare fork floor's process ended: {words}")
        return float(line[0]), float(line[1])

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _mount(args: argparse.Namespace) -> EnvironmentMount:
    section: dict[str, Any] = {"allow": args.allow.split(","), "source": args.source}
    if args.wheelhouse is not None:
        section["wheelhouse"] = str(args.wheelhouse)
    store = EnvironmentStore(args.store)
    began = time.monotonic()
    requirements = (args.requirements or args.module).split(",")
    prepared = store.prepare(normalise(requirements), DependencyPolicy.model_validate(section), probe(sys.executable),
                             progress=lambda message: print(f"  {message}", file=sys.stderr))  # fmt: skip
    print(f"environment {prepared.env_id[:12]} ready in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return EnvironmentMount(env_id=prepared.env_id, site=str(prepared.site), modules=(args.module,))


def _run(sandbox: Sandbox, code: str, mount: EnvironmentMount | None) -> tuple[float, float]:
    began = time.perf_counter()
    outcome = sandbox.execute(ExecutionRequest(code=code, environment=mount))
    elapsed = time.perf_counter() - began
    if not outcome.ok:
        raise SystemExit(f"the benchmark's program failed: {outcome.error_type}: {outcome.error_message}")
    return elapsed * 1000, outcome.usage.cpu_time_s * 1000


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    wall = sorted(s[0] for s in samples)
    return {
        "p50_ms": round(statistics.median(wall), 2),
        "p90_ms": round(wall[int(0.9 * (len(wall) - 1))], 2),
        "cpu_p50_ms": round(statistics.median(s[1] for s in samples), 2),
    }


def bench(args: argparse.Namespace) -> dict[str, Any]:
    mount = _mount(args)
    code = args.code or CODE.get(args.module, f"import {args.module}\nreturn sum([1, 2, 3])\n")
    load_before = os.getloadavg()
    with (
        Sandbox(SandboxConfig(backend="subprocess", pool_size=1, env_zygotes_max=2)) as zygotes,
        Sandbox(SandboxConfig(backend="subprocess", pool_size=1, env_zygotes_max=0)) as plain,
    ):
        _run(zygotes, FLOOR_CODE, None)
        cold_ms, _ = _run(zygotes, code, mount)  # the environment zygote is built here: the import, once
        subjects = {"floor": (zygotes, FLOOR_CODE, None), "measured": (zygotes, code, mount),
                    "env, no import": (zygotes, FLOOR_CODE, mount), "env, plain": (plain, FLOOR_CODE, mount),
                    "before": (plain, code, mount)}  # fmt: skip
        bare = {"bare, plain": BareForks("", "", FLOOR_CODE), "bare, package": BareForks(mount.site, args.module, code)}
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in [*subjects, *bare]}
        try:
            for _ in range(2):  # warm-up: every pool made and filled once
                for sandbox, text, env in subjects.values():
                    _run(sandbox, text, env)
                    time.sleep(args.gap)
            for _ in range(args.rounds):
                for name, (sandbox, text, env) in subjects.items():
                    time.sleep(args.gap)  # warm means a worker waiting in the pool: let the refill finish
                    samples[name].append(_run(sandbox, text, env))
                for name, forks in bare.items():
                    samples[name].append(forks.sample())
        finally:
            for forks in bare.values():
                forks.close()
    figures = {name: _summary(values) for name, values in samples.items()}
    floor = figures["floor"]["p50_ms"]
    ratio = figures["measured"]["p50_ms"] / floor
    reachable = floor + figures["bare, package"]["p50_ms"] - figures["bare, plain"]["p50_ms"]
    return {
        "module": args.module, "rounds": args.rounds, "gap_s": args.gap, "cold_first_run_ms": round(cold_ms, 1),
        "subjects": figures, "ratio": round(ratio, 2), "goal": GOAL, "goal_met": ratio <= GOAL,
        "before_ratio": round(figures["before"]["p50_ms"] / floor, 2),
        "reachable_floor_ms": round(reachable, 2), "reachable_ratio": round(reachable / floor, 2),
        "to_reachable": round(figures["measured"]["p50_ms"] / reachable, 2),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    lines = [f"warm run of a {result['module']} program vs no packages, subprocess, {result['rounds']} rounds, "
             f"load {result['load_before'][0]:.1f} -> {result['load_after'][0]:.1f}",
             f"{'subject':15} {'p50 ms':>8} {'p90 ms':>8} {'runner CPU p50 ms':>18}"]  # fmt: skip
    for name, figures in result["subjects"].items():
        lines.append(f"{name:15} {figures['p50_ms']:8.1f} {figures['p90_ms']:8.1f} {figures['cpu_p50_ms']:18.1f}")
    status = "PASS" if result["goal_met"] else "FAIL"
    cold = result["cold_first_run_ms"]
    lines.append(f"{status}  measured / floor = {result['ratio']:.2f}x (goal <= {result['goal']}x); "
                 f"before: {result['before_ratio']:.2f}x; cold first run {cold:.0f} ms")  # fmt: skip
    proposed = "PASS" if result["to_reachable"] <= PROPOSED_TO_REACHABLE else "FAIL"
    lines.append(f"reachable floor (floor + bare package - bare plain) {result['reachable_floor_ms']:.1f} ms = "
                 f"{result['reachable_ratio']:.2f}x the floor")  # fmt: skip
    lines.append(f"{proposed}  measured / reachable floor = {result['to_reachable']:.2f}x (proposed goal <= "
                 f"{PROPOSED_TO_REACHABLE}x: the {result['goal']}x goal is below the floor when the reachable floor "
                 f"exceeds it)")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="pandas", help="the top-level module the program imports")
    parser.add_argument("--requirements", default=None, help="comma-separated distributions (default: --module)")
    parser.add_argument("--code", default=None, help="the package program (default: one for --module)")
    parser.add_argument("--allow", default=PANDAS_ALLOW, help="the dependency policy's allow list, comma-separated")
    parser.add_argument("--source", default="index", choices=("index", "offline"))
    parser.add_argument("--wheelhouse", type=Path, default=None)
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help="where environments are built (kept)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds before each sample (pools refill)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    result = bench(args)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
