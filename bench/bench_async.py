"""The async API's concurrency: N concurrent awaited executions vs the sync API with N threads (issue 24).

    .venv/bin/python bench/bench_async.py [--n 200] [--rounds 5] [--pool-size 2] [--spawn-concurrency 4] [--out FILE]

Both sides run the same trivial program (``return args[0] * 2``) on the subprocess backend, with the same
``SandboxConfig`` (warm pool of ``--pool-size``, the default spawn concurrency), in one process, alternating
round by round so both see the same machine load:

- sync: N threads, released together, each calling ``Sandbox.execute`` once;
- async: one event loop, ``asyncio.gather`` of N ``AsyncSandbox.execute`` awaits.

A round's throughput is N / (wall time from release until the last outcome). Reported per side: the median and
each round's executions per second, the process's peak thread count during the rounds (sampled every
millisecond and a half), and the host process's CPU per execution (every thread; the sandboxes' own CPU is
not in it). On 2 cores the sandboxes and the host share the CPU, so host CPU saved is throughput.
Goal: the async median at least the sync one's, with a fraction of its threads. The
load average is printed beside the figures (the lead re-runs this at low load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandforge.sandbox import AsyncSandbox, ExecutionOutcome, ExecutionRequest, Sandbox, SandboxConfig

PROGRAM = "return args[0] * 2"


class ThreadPeak:
    """The peak of ``threading.active_count()`` while it runs (a sampling thread of its own, counted out)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-thread-peak", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, threading.active_count() - 1)
            self._stop.wait(0.0015)

    def __enter__(self) -> ThreadPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _check(outcomes: list[ExecutionOutcome], n: int) -> None:
    bad = [o for o in outcomes if not o.ok]
    if len(outcomes) != n or bad or [o.value for o in outcomes] != [2 * i for i in range(n)]:
        first = bad[0].error_message if bad else "wrong values"
        raise SystemExit(f"error: {len(bad)} of {n} executions failed: {first}")


def sync_round(sb: Sandbox, n: int) -> tuple[float, int]:
    """N threads released together, one execution each: (seconds until the last is done, peak threads)."""
    outcomes: list[ExecutionOutcome | None] = [None] * n
    release = threading.Barrier(n + 1)

    def one(i: int) -> None:
        release.wait()
        outcomes[i] = sb.execute(ExecutionRequest(code=PROGRAM, args=[i]))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    with ThreadPeak() as peak:
        for t in threads:
            t.start()
        release.wait()
        began = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - began
    _check([o for o in outcomes if o is not None], n)
    return wall, peak.peak


def async_round(asb: AsyncSandbox, loop: asyncio.AbstractEventLoop, n: int) -> tuple[float, int]:
    """N awaits gathered on one loop: (seconds until the last is done, peak threads)."""

    async def all_of_them() -> list[ExecutionOutcome]:
        return list(await asyncio.gather(*(asb.execute(ExecutionRequest(code=PROGRAM, args=[i])) for i in range(n))))

    with ThreadPeak() as peak:
        began = time.perf_counter()
        outcomes = loop.run_until_complete(all_of_them())
        wall = time.perf_counter() - began
    _check(outcomes, n)
    return wall, peak.peak


def host_cpu_s() -> float:
    """This process's CPU time (every thread: the loop, the pools' start threads, the callers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _settle(sb: Sandbox) -> None:
    """Between rounds: the warm pool full again, so every round starts alike."""
    sb.pool().wait_ready(timeout=60)


def measure(n: int, rounds: int, pool_size: int, spawns: int, log: Callable[[str], None]) -> dict[str, Any]:
    config = SandboxConfig(backend="subprocess", pool_size=pool_size, pool_spawn_concurrency=spawns)
    loop = asyncio.new_event_loop()
    results: dict[str, Any] = {"sync": {"rounds": []}, "async": {"rounds": []}}
    try:
        with Sandbox(config) as sb:
            asb = AsyncSandbox(sb)
            for warm in range(2):  # the zygote, the pool, the loop's first tasks
                sync_round(sb, 8)
                async_round(asb, loop, 8)
                _settle(sb)
                log(f"warm-up {warm + 1} done")
            for r in range(rounds):
                for side in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                    _settle(sb)
                    load, cpu = os.getloadavg()[0], host_cpu_s()
                    wall, threads = sync_round(sb, n) if side == "sync" else async_round(asb, loop, n)
                    cpu_ms = (host_cpu_s() - cpu) / n * 1000
                    figures = {"per_s": n / wall, "wall_s": wall, "threads": threads, "load1": load, "cpu_ms": cpu_ms}
                    results[side]["rounds"].append(figures)
                    log(f"round {r + 1} {side:5}: {n / wall:7.1f} executions/s, {threads} threads, "
                        f"{cpu_ms:.2f} ms host CPU each (load {load:.2f})")  # fmt: skip
            loop.run_until_complete(asb.aclose())
    finally:
        loop.close()
    for side in ("sync", "async"):
        per_s = [r["per_s"] for r in results[side]["rounds"]]
        results[side]["median_per_s"] = statistics.median(per_s)
        results[side]["peak_threads"] = max(r["threads"] for r in results[side]["rounds"])
        results[side]["median_cpu_ms"] = statistics.median(r["cpu_ms"] for r in results[side]["rounds"])
    results["ratio"] = results["async"]["median_per_s"] / results["sync"]["median_per_s"]
    results["thread_fraction"] = results["async"]["peak_threads"] / results["sync"]["peak_threads"]
    results["n"], results["rounds"], results["pool_size"], results["spawn_concurrency"] = n, rounds, pool_size, spawns
    results["cpus"], results["loadavg"] = os.cpu_count(), os.getloadavg()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="concurrent executions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool-size", type=int, default=SandboxConfig().pool_size)
    parser.add_argument(
        "--spawn-concurrency",
        type=int,
        default=SandboxConfig().pool_spawn_concurrency,
        help="the pool's spawn threads (the async side's waiters are served by them)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    res = measure(args.n, args.rounds, args.pool_size, args.spawn_concurrency, progress)
    one, five, fifteen = res["loadavg"]
    print(f"{args.n} concurrent executions, subprocess backend, {res['cpus']} CPUs, "
          f"load {one:.2f} {five:.2f} {fifteen:.2f}")  # fmt: skip
    print(f"{'':6} {'median exec/s':>14} {'peak threads':>13} {'host CPU ms/exec':>17}  rounds (exec/s)")
    for side, label in (("sync", "sync"), ("async", "async")):
        s = res[side]
        rounds = " ".join(f"{r['per_s']:.1f}" for r in s["rounds"])
        print(f"{label:6} {s['median_per_s']:14.1f} {s['peak_threads']:13d} {s['median_cpu_ms']:17.2f}  {rounds}")
    goal = "met" if res["ratio"] >= 1.0 else "NOT met"
    print(f"async/sync throughput {res['ratio']:.2f}x with {res['thread_fraction']:.0%} of the threads "
          f"(goal >= 1.0x: {goal})")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
