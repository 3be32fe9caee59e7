"""Issue 15's speed targets: the restricted language against plain CPython, in one process, side by side.

``python -m bench.bench_compat [--quick] [--out FILE]`` measures, interleaving plain and restricted runs:

- the compatibility corpus (tests/compat): per program, compile plus run and execution only (the
  program's ``def`` executed and called; no compilation), as ratios restricted / plain of the medians;
- per-construct micro-benchmarks (append, ``+=`` on a name / attribute / item, swap, unpacking, method
  call, attribute read, dict counting, string building): execution only;
- the model-style workload (``bench.workloads.MODEL_STYLE``): execution only, and compile plus run;
- with ``--tripwire``, what the tripwire (issue 36) costs: the corpus through real subprocess sandboxes, the
  runner started with its audit hook and without it, interleaved (an armed hook cannot be removed from a
  process, so the side-by-side run needs a process per execution).

"Restricted" is exactly what the runner does (``compile_program``, ``build_globals``, ``LazyContext``),
without the process and its lock-down (that cost is measured by ``python -m bench``). The load average
is recorded with the numbers: on a shared machine ratios move with it, so each ratio compares the best of
N interleaved runs of each form (the run least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "sandbox"))  # the inside is a plain top-level package, as in the sandbox

from inside import bridge, compilation, guards, lazycontext, world  # noqa: E402

from bench.workloads import MODEL_STYLE  # noqa: E402
from tests.compat import corpus  # noqa: E402

#: (name, setup, loop body): each runs ``N`` times inside a function, as a program's loop would.
CONSTRUCTS: list[tuple[str, str, str]] = [
    ("append", "out = []", "out.append(i)"),
    ("name +=", "total = 0", "total += i"),
    ("attribute +=", "class C:\n    pass\nc = C()\nc.n = 0", "c.n += i"),
    ("item +=", "d = {'k': 0}", "d['k'] += i"),
    ("attribute write", "class C:\n    pass\nc = C()", "c.n = i"),
    ("swap", "a, b = 1, 2", "a, b = b, a"),
    ("unpack in for", "pairs = [(1, 2)] * 8", "for x, y in pairs:\n        pass"),
    ("method call", "s = 'Hello'", "s.lower()"),
    ("attribute read", "import math", "math.pi"),
    ("dict counting", "counts = {}\nwords = ['a', 'b', 'c']", "w = words[i % 3]\n    counts[w] = counts.get(w, 0) + 1"),
    ("string building", "parts = []", "parts.append(f'{i}:' + str(i))"),
    ("own method call", "class C:\n    def f(self, x):\n        return x\nc = C()", "c.f(i)"),
]


def plain_function(code: str) -> Callable[..., Any]:
    source = "def sandforge_tool(context, args, kwargs):\n" + textwrap.indent(code, "    ") + "\n"
    namespace: dict[str, Any] = {"__name__": world.PROGRAM_MODULE, "Outcome": bridge.OutcomeFactory}
    exec(compile(source, "<tool>", "exec"), namespace)
    return namespace["sandforge_tool"]  # type: ignore[no-any-return]


class Restricted:
    """The runner's steps for one program, in process."""

    def __init__(self) -> None:
        self.proxies = world.build_module_proxies()

    def compile(self, code: str) -> Any:
        compiled, error = compilation.compile_program(code)
        if error is not None:
            raise RuntimeError(error["message"])
        return compiled

    def function(self, compiled: Any) -> Callable[..., Any]:
        namespace = guards.build_globals(self.proxies, world.BoundedText(1 << 20), None)  # type: ignore[arg-type]
        exec(compiled, namespace)
        return namespace[world.TOOL_FUNCTION]  # type: ignore[no-any-return]


def _context(program: corpus.Program, restricted: bool) -> Any:
    if restricted:
        return lazycontext.LazyContext({k: json.dumps(v).encode() for k, v in program.context.items()})
    return copy.deepcopy(program.context)


def time_once(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        fn()
    return time.perf_counter() - start


def _plain_code(code: str) -> Any:
    return compile("def sandforge_tool(context, args, kwargs):\n" + textwrap.indent(code, "    "), "<tool>", "exec")


def _corpus_forms(restricted: Restricted, program: corpus.Program) -> dict[str, Callable[[], Any]]:
    """The five ways one program is run: plain CPython compile+run and run, the sandbox's compile+run cold
    (compiled on the host for the first time), warm (the text compiled before, by its validation), and run."""
    args, kwargs = program.args, program.kwargs
    compiled = restricted.compile(program.code)
    plain_code = _plain_code(program.code)

    def plain_all() -> Any:
        return plain_function(program.code)(_context(program, False), copy.deepcopy(args), copy.deepcopy(kwargs))

    def plain_exec() -> Any:
        namespace: dict[str, Any] = {"__name__": world.PROGRAM_MODULE, "Outcome": bridge.OutcomeFactory}
        exec(plain_code, namespace)
        return namespace["sandforge_tool"](_context(program, False), copy.deepcopy(args), copy.deepcopy(kwargs))

    def restricted_cold() -> Any:
        compilation._HOST_CODE.pop(program.code, None)
        return restricted_warm()

    def restricted_warm() -> Any:
        code = compilation.shipped_code({"compiled": compilation.host_compiled(program.code)})
        return restricted.function(code)(_context(program, True), copy.deepcopy(args), copy.deepcopy(kwargs))

    def restricted_exec() -> Any:
        return restricted.function(compiled)(_context(program, True), copy.deepcopy(args), copy.deepcopy(kwargs))

    return {"plain_all": plain_all, "plain_exec": plain_exec, "restricted_cold": restricted_cold,
            "restricted_warm": restricted_warm, "restricted_exec": restricted_exec}  # fmt: skip


def measure_corpus(rounds: int) -> list[dict[str, Any]]:
    restricted = Restricted()
    rows = []
    for program in corpus.load():
        try:
            forms = _corpus_forms(restricted, program)
        except RuntimeError:
            continue  # refused by the sandbox: no speed to compare
        samples: dict[str, list[float]] = {name: [] for name in forms}
        try:
            for _ in range(rounds):
                for name, form in forms.items():
                    samples[name].append(time_once(form))
        except Exception:
            continue  # a program that fails in either form (Outcome.error...) has no speed to compare
        med = {k: min(v) for k, v in samples.items()}  # best of N: the machine is shared
        rows.append({
            "program": program.name,
            "plain_all_us": med["plain_all"] * 1e6,
            "cold_ratio": med["restricted_cold"] / med["plain_all"],
            "warm_ratio": med["restricted_warm"] / med["plain_all"],
            "plain_exec_us": med["plain_exec"] * 1e6,
            "exec_ratio": med["restricted_exec"] / med["plain_exec"],
        })  # fmt: skip
    return rows


def measure_constructs(iterations: int, rounds: int) -> list[dict[str, Any]]:
    restricted = Restricted()
    rows = []
    for name, setup, body in CONSTRUCTS:
        code = f"{setup}\nfor i in range({iterations}):\n    {body}\nreturn 1"
        plain = compile("def sandforge_tool(context, args, kwargs):\n" + textwrap.indent(code, "    "), "<t>", "exec")
        compiled = restricted.compile(code)
        plain_times, restricted_times = [], []
        for _ in range(rounds):
            namespace: dict[str, Any] = {"__name__": world.PROGRAM_MODULE}
            exec(plain, namespace)
            plain_times.append(time_once(lambda ns=namespace: ns["sandforge_tool"]({}, [], {})))  # type: ignore[misc]
            fn = restricted.function(compiled)
            restricted_times.append(time_once(lambda fn=fn: fn(lazycontext.LazyContext({}), [], {})))  # type: ignore[misc]
        p, r = min(plain_times), min(restricted_times)
        rows.append({"construct": name, "plain_ns": p / iterations * 1e9, "restricted_ns": r / iterations * 1e9,
                     "ratio": r / p, "same_bytecode": _instructions(plain) == _instructions(compiled)})  # fmt: skip
    return rows


def _instructions(module_code: Any) -> list[tuple[str, Any]]:
    """The tool function's instructions (name and argument): equal lists mean the restricted compilation
    emitted exactly what plain CPython does, whatever the load on the machine says about the timings."""
    import dis

    function = next(c for c in module_code.co_consts if hasattr(c, "co_code"))
    return [(i.opname, i.argval) for i in dis.get_instructions(function)]


def measure_model_style(rounds: int) -> dict[str, Any]:
    restricted = Restricted()
    program = corpus.Program("model_style", MODEL_STYLE)
    compiled = restricted.compile(MODEL_STYLE)
    plain_code = _plain_code(MODEL_STYLE)
    out: dict[str, list[float]] = {"plain_exec": [], "restricted_exec": [], "plain_all": [], "restricted_all": []}
    for _ in range(rounds):
        namespace: dict[str, Any] = {"__name__": world.PROGRAM_MODULE}
        exec(plain_code, namespace)
        out["plain_exec"].append(time_once(lambda ns=namespace: ns["sandforge_tool"]({}, [], {})))  # type: ignore[misc]
        fn = restricted.function(compiled)
        out["restricted_exec"].append(time_once(lambda fn=fn: fn(_context(program, True), [], {})))  # type: ignore[misc]
        out["plain_all"].append(time_once(lambda: plain_function(MODEL_STYLE)({}, [], {})))
        out["restricted_all"].append(
            time_once(
                lambda: restricted.function(
                    compilation.shipped_code({"compiled": compilation.host_compiled(MODEL_STYLE)})
                )(_context(program, True), [], {})
            )
        )
    med = {k: min(v) for k, v in out.items()}
    return {
        "plain_exec_ms": med["plain_exec"] * 1e3,
        "exec_ratio": med["restricted_exec"] / med["plain_exec"],
        "plain_all_ms": med["plain_all"] * 1e3,
        "compile_run_ratio": med["restricted_all"] / med["plain_all"],
    }


def measure_tripwire(rounds: int) -> dict[str, Any]:
    """Each corpus program executed in real subprocess sandboxes, the runner started with its audit hook (no
    seam: production) and without it (``BootSeam(tripwire_off=True)``, the benchmark's seam), interleaved
    A B A B; the time of one execution is the exchange's (``duration_s``: the execute frame sent to the result
    read; the runner's start is not in it). The noise floor is the same comparison between the odd and the
    even runs without the hook. A program whose status differs between the forms is listed (a wrong trip)."""
    from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig, seam
    from sandforge.sandbox.protocol import BootSeam

    forms = (("on", None), ("off", BootSeam(tripwire_off=True)))
    rows, differing = [], []
    try:
        with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sandbox:
            for program in corpus.load():
                request = ExecutionRequest(code=program.code, args=program.args, kwargs=program.kwargs,
                                           context=program.context)  # fmt: skip
                samples: dict[str, list[float]] = {"on": [], "off": []}
                statuses: dict[str, set[str]] = {"on": set(), "off": set()}
                for _ in range(rounds):
                    for form, active in forms:
                        seam.ACTIVE = active
                        outcome = sandbox.execute(request)
                        samples[form].append(outcome.duration_s)
                        statuses[form].add(f"{outcome.status}:{outcome.error_type}")
                if statuses["on"] != statuses["off"]:
                    differing.append(program.name)
                on, off = statistics.median(samples["on"]), statistics.median(samples["off"])
                noise = statistics.median(samples["off"][0::2]) / statistics.median(samples["off"][1::2])
                rows.append({"program": program.name, "on_ms": on * 1e3, "off_ms": off * 1e3, "ratio": on / off,
                             "noise_ratio": noise})  # fmt: skip
    finally:
        seam.ACTIVE = None
    return {
        "rounds": rounds,
        "on_ms": summary(rows, "on_ms"),
        "off_ms": summary(rows, "off_ms"),
        "ratio": summary(rows, "ratio"),
        "noise_ratio": summary(rows, "noise_ratio"),
        "differing_status": differing,
        "programs": rows,
    }


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = sorted(r[key] for r in rows)
    return {"median": statistics.median(values), "worst": values[-1], "p90": values[int(0.9 * (len(values) - 1))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke test, not a measurement)")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--tripwire", action="store_true", help="only the tripwire's cost, through real sandboxes")
    args = parser.parse_args(argv)
    if args.tripwire:
        return _report_tripwire(2 if args.quick else 8, args.out)
    rounds = 3 if args.quick else 21
    load_before = os.getloadavg()
    corpus_rows = measure_corpus(rounds)
    constructs = measure_constructs(2_000 if args.quick else 100_000, 3 if args.quick else 9)
    model = measure_model_style(3 if args.quick else 9)
    report = {
        "python": sys.version.split()[0],
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "corpus_programs": len(corpus_rows),
        "corpus_compile_run_cold": summary(corpus_rows, "cold_ratio"),
        "corpus_compile_run": summary(corpus_rows, "warm_ratio"),
        "corpus_exec": summary(corpus_rows, "exec_ratio"),
        "constructs": constructs,
        "model_style": model,
        "corpus": corpus_rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"load average {load_before[0]:.2f} -> {report['loadavg_after'][0]:.2f}, {len(corpus_rows)} programs")
    for key in ("corpus_compile_run_cold", "corpus_compile_run", "corpus_exec"):
        s = report[key]
        print(f"{key:20} median {s['median']:.2f}x  p90 {s['p90']:.2f}x  worst {s['worst']:.2f}x")
    print(f"model_style          exec {model['exec_ratio']:.2f}x ({model['plain_exec_ms']:.1f} ms plain), "
          f"compile+run {model['compile_run_ratio']:.2f}x")  # fmt: skip
    for row in constructs:
        plain, ours = row["plain_ns"], row["restricted_ns"]
        same = "same bytecode as CPython" if row["same_bytecode"] else "guarded"
        print(f"  {row['construct']:16} {plain:7.1f} ns plain  {ours:7.1f} ns  {row['ratio']:.2f}x  {same}")
    worst = sorted(corpus_rows, key=lambda r: -r["warm_ratio"])[:5]
    print("slowest compile+run:", ", ".join(f"{r['program']} {r['warm_ratio']:.1f}x" for r in worst))
    return 0


def _report_tripwire(rounds: int, out: Path | None) -> int:
    load_before = os.getloadavg()
    report = {"python": sys.version.split()[0], "loadavg_before": load_before, **measure_tripwire(rounds),
              "loadavg_after": os.getloadavg()}  # fmt: skip
    if out:
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    after = report["loadavg_after"]
    print(f"load average {load_before[0]:.2f} -> {after[0]:.2f}, {len(report['programs'])} programs, "
          f"{rounds} runs of each form, interleaved")  # fmt: skip
    for key, unit in (("on_ms", "ms"), ("off_ms", "ms"), ("ratio", "x"), ("noise_ratio", "x")):
        s = report[key]
        print(f"{key:12} median {s['median']:.3f}{unit}  p90 {s['p90']:.3f}{unit}  worst {s['worst']:.3f}{unit}")
    print("status differs with the hook:", ", ".join(report["differing_status"]) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
