"""Measurement loops shared by our process and the peers' driver (standard library only).

A subject is a callable ``run_one(program) -> Result`` that executes one program in a fresh sandbox
and returns what came back; it raises ``Failed`` for an execution that did not succeed. The loops time
each call from the caller's side (``time.perf_counter`` around the whole call) and check the value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.stats import Series, Throughput


class Failed(Exception):
    """One execution failed (error outcome, crash, wrong value)."""


@dataclass
class Result:
    value: Any
    peak_mb: float | None = None


class HasProgram(Protocol):
    @property
    def code(self) -> str: ...

    @property
    def expected(self) -> Any: ...


RunOne = Callable[[Any], Result]


def _check(program: HasProgram, result: Result) -> None:
    if result.value != program.expected:
        raise Failed(f"wrong value: {str(result.value)[:80]!r} != expected {str(program.expected)[:80]!r}")


def latency(
    run_one: RunOne,
    programs: Sequence[Any],
    *,
    n: int,
    budget_s: float,
    before: Callable[[], None] | None = None,
    min_n: int = 3,
    warmup: int = 1,
) -> Series:
    """``n`` sequential executions, cycling through ``programs`` (each once at least when n >= len).

    Stops early when ``budget_s`` is spent (after ``min_n`` samples); ``extra.truncated`` then says so.
    ``before`` runs untimed before each execution (e.g. waiting until the warm pool is full again).
    ``warmup`` executions run first, untimed and unchecked, for every subject alike: they pay what a process
    pays once (connecting to the engine, lazy imports, the image entering the page cache), never per call.
    """
    for i in range(warmup):
        if before is not None:
            before()
        try:
            run_one(programs[i % len(programs)])
        except Exception as exc:
            series_error = f"warm-up failed: {type(exc).__name__}: {exc}"
            break
    else:
        series_error = None
    series = Series()
    if series_error:
        series.extra["warmup_error"] = series_error[:300]
    started = time.monotonic()
    for i in range(n):
        if i >= min_n and time.monotonic() - started > budget_s:
            series.extra["truncated"] = f"stopped after {i} of {n} runs (time budget {budget_s:g}s)"
            break
        program = programs[i % len(programs)]
        if before is not None:
            before()
        t0 = time.perf_counter()
        try:
            result = run_one(program)
            elapsed = time.perf_counter() - t0
            _check(program, result)
        except Failed as exc:
            series.fail(str(exc))
            continue
        except Exception as exc:  # a peer's own exception type: still one failed execution
            series.fail(f"{type(exc).__name__}: {exc}")
            continue
        series.ok(elapsed, result.peak_mb)
    return series


def throughput(run_one: RunOne, program: Any, *, seconds: float, concurrency: int) -> Throughput:
    """``concurrency`` threads execute ``program`` back to back for ``seconds`` of wall time.

    An execution counts when it succeeded; runs still in flight at the deadline are finished and counted,
    and the wall time runs until the last one ends (so the rate is never flattered by a cut tail).
    """
    out = Throughput(concurrency=concurrency)
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < deadline:
            try:
                _check(program, run_one(program))
                ok, message = True, ""
            except Exception as exc:
                ok, message = False, f"{type(exc).__name__}: {exc}"
            with lock:
                if ok:
                    out.completed += 1
                else:
                    out.errors += 1
                    if len(out.error_samples) < 3:
                        out.error_samples.append(message[:300])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.wall_s = time.monotonic() - t0
    return out
