"""What OpenTelemetry costs a call (issue 21): the call loop with telemetry off (the no-op seam: nothing of
OpenTelemetry imported) and on (the SDK with its in-memory exporter and reader), measured side by side in one run.

    python bench/bench_telemetry.py [--calls 2000] [--real 200]

"memory" runs the whole lifecycle (generate, validate, execute, commit, record) against an in-process sandbox
that answers at once, so what is left is the lifecycle's own cost and the telemetry's; "subprocess" is a real
call on the subprocess backend's warm pool. Prints per-call medians, the ratio on/off and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandforge.runtime import telemetry
from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.lifecycle import CallRun
from sandforge.runtime.agent.state import StagedRecord, State
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import BridgeHandler, ExecutionOutcome, ExecutionRequest, Limits

PROGRAM = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"


class InstantSandbox:
    """Answers every program at once: the lifecycle's own cost remains."""

    def execute(self, request: ExecutionRequest, *, backend: Any = None, bridge: BridgeHandler | None = None,
                ) -> ExecutionOutcome:  # fmt: skip
        return ExecutionOutcome(status="ok", value=1, context={"n": 1}, backend="memory")


def memory_env(calls: int) -> CallEnv:
    sink: list[StagedRecord] = []
    return CallEnv(
        provider=ScriptedProvider([PROGRAM] * calls), provider_name="scripted", policy=default_policy(),
        sandbox=InstantSandbox(), backend=None, limits=Limits(), budgets=Budgets(), trace_budget=TraceBudget(),
        store=None, state=State(sink.extend), records=lambda staged: sink.clear(),
    )  # fmt: skip


def otel_on() -> telemetry.Telemetry:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer = TracerProvider()
    exporter = InMemorySpanExporter()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    on = telemetry.configure(tracer, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    on.exporter = exporter  # type: ignore[attr-defined]
    return on


def per_call(run_one: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        run_one(i)
        out.append(time.perf_counter() - started)
    return out


def side_by_side(run_one: Any, calls: int, on: telemetry.Telemetry, blocks: int = 10) -> dict[str, float]:
    """Alternate blocks of calls off and on, so load changes hit both alike."""
    off_s: list[float] = []
    on_s: list[float] = []
    size = max(1, calls // blocks)
    for _ in range(blocks):
        telemetry.reset(telemetry.NULL)
        off_s += per_call(run_one, size)
        telemetry.reset(on)
        on_s += per_call(run_one, size)
        on.exporter.clear()  # type: ignore[attr-defined]
    telemetry.reset(telemetry.NULL)
    off, onn = statistics.median(off_s) * 1e6, statistics.median(on_s) * 1e6
    return {"off_us": off, "on_us": onn, "ratio": onn / off, "added_us": onn - off}


def memory_figures(calls: int, on: telemetry.Telemetry) -> dict[str, float]:
    env = memory_env(2 * calls + 10)

    def one(i: int) -> None:
        out = CallRun.top(env, CallSpec(role="calc", method="inc", args=[i], kwargs={})).run()
        assert out.ok, out

    one(0)  # warm the policy and the compiled-code caches
    return side_by_side(one, calls, on)


def subprocess_figures(calls: int, on: telemetry.Telemetry) -> dict[str, float]:
    from sandforge.runtime.agent import CallLog, Workspace
    from sandforge.sandbox import SandboxConfig

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-telemetry-{os.getpid()}.jsonl"
    ws = Workspace(provider=ScriptedProvider([PROGRAM] * (2 * calls + 10)),
                   sandbox=SandboxConfig(backend="subprocess", pool_size=2), log=CallLog(log))  # fmt: skip
    try:
        ws.sandbox.pool("subprocess").wait_ready(2, timeout=60)

        def one(i: int) -> None:
            out = ws.call("calc", f"m{i % 1}", i)
            assert out.ok, out

        one(0)
        return side_by_side(one, calls, on)
    finally:
        ws.close()
        log.unlink(missing_ok=True)


def noop_hooks_us(n: int = 20000) -> float:
    """What the hooks of one call cost with telemetry off: the same hook calls a call makes, on the no-op seam."""
    from sandforge.runtime.agent import observe
    from sandforge.runtime.agent.outcome import Outcome

    null = telemetry.NULL
    spec = CallSpec(role="calc", method="inc", args=[1], kwargs={})
    outcome = Outcome(status="ok", value=1, tool_role="calc", method_name="inc", metadata={})
    executed = ExecutionOutcome(status="ok", value=1, backend="memory")
    started = time.perf_counter()
    for _ in range(n):
        tel = telemetry.current()
        with observe.call_span(null, spec) as span:
            with observe.generation(null, "scripted", None) as g:
                observe.generated(g, model=None, input_tokens=None, output_tokens=None, repair=False)
            with observe.stage(null, "validate"):
                pass
            with observe.stage(null, "execute") as ex:
                observe.executed(null, ex, executed, started_ns=0)
            with observe.stage(null, "commit"):
                pass
            observe.call_ended(tel, span, spec, outcome)
    return (time.perf_counter() - started) / n * 1e6


def imported_when_off() -> list[str]:
    """OpenTelemetry modules a fresh interpreter imports for a call with telemetry off (should be none)."""
    root = str(Path(__file__).resolve().parent.parent)
    code = (
        f"import sys\nsys.path.insert(0, {root!r})\nfrom bench.bench_telemetry import memory_env\n"
        "from sandforge.runtime.agent.lifecycle import CallRun\nfrom sandforge.runtime.agent.env import CallSpec\n"
        "CallRun.top(memory_env(2), CallSpec(role='r', method='m', args=[], kwargs={})).run()\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDFORGE_OTEL"))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per side, in-memory sandbox")
    parser.add_argument("--real", type=int, default=200, help="calls per side, subprocess backend (0: skip)")
    args = parser.parse_args()
    load = os.getloadavg()
    on = otel_on()
    rows = [("memory", memory_figures(args.calls, on))]
    if args.real:
        rows.append(("subprocess", subprocess_figures(args.real, on)))
    print(f"telemetry cost per call, median, off vs on side by side; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} at start, {os.getloadavg()[0]:.2f} at end")  # fmt: skip
    print(f"{'sandbox':<11} {'off us':>9} {'on us':>9} {'on/off':>7} {'added us':>9}")
    for name, f in rows:
        print(f"{name:<11} {f['off_us']:>9.1f} {f['on_us']:>9.1f} {f['ratio']:>7.2f} {f['added_us']:>9.1f}")
    telemetry.reset(telemetry.NULL)
    print(f"telemetry off: the hooks of one call cost {noop_hooks_us():.2f} us (no-op seam)")
    print(f"opentelemetry modules imported with telemetry off: {imported_when_off() or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
