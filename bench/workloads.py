"""The fixed workloads: tool programs (function bodies, the sandforge program contract) plus their contexts.

Every subject runs the *same* program text. Our backends run it as it is; the floors and peers run it
wrapped by :func:`script` into a plain Python script with the same contract (context in as JSON, the
return value and the new context out as JSON), because none of them understands a function body.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the peers' interpreter imports this module too, and has no sandforge
    from sandforge.sandbox.context import ContextSnapshot

#: Iterations of the CPU-bound loop: about 50 ms of pure CPython on this project's machines.
CPU_ITERATIONS = 750_000

TRIVIAL = "return 1 + 1"

CPU_BOUND = f"""total = 0
for i in range({CPU_ITERATIONS}):
    total = (total + i * i) % 1000003
context['total'] = total
return total
"""

#: The forms models write (issue 15): a small class with state, accumulators (``+=`` on names, attributes
#: and items), tuple unpacking and swaps, method calls, string building and dict counting. The CPU workload
#: above avoids all of them; this one is made of little else (~50 ms of pure CPython).
MODEL_STYLE_ITERATIONS = 10_000
MODEL_STYLE = f"""from collections import defaultdict


class Account:
    def __init__(self, owner):
        self.owner = owner
        self.balance = 0
        self.history = []

    def deposit(self, amount):
        self.balance += amount
        self.history.append(amount)


counts = defaultdict(int)
totals = {{}}
accounts = [Account(f"user{{i}}") for i in range(10)]
parts = []
a, b = 0, 1
for i in range({MODEL_STYLE_ITERATIONS}):
    acct = accounts[i % 10]
    acct.deposit(i % 7)
    word = "w" + str(i % 13)
    counts[word] += 1
    totals[acct.owner] = totals.get(acct.owner, 0) + 1
    for key, value in ((word, i), (acct.owner, i % 3)):
        if value % 2:
            parts.append(key.upper())
    a, b = b, (a + b) % 1000
    if i % 1000 == 0:
        parts.append(f"{{i}}:{{acct.balance}}")
text = "|".join(parts)
context["summary"] = {{"words": len(counts), "text_len": len(text), "fib": a}}
return [sum(x.balance for x in accounts), counts["w3"], len(text), a]
"""

#: Reads the whole context and writes a key back.
CONTEXT_PROGRAM = """rows = context['rows']
context['count'] = len(rows)
return len(rows)
"""

#: Carries the context, touching one small key: the cost of state a program does not read.
CARRY_PROGRAM = """context['count'] = context.get('count', 0) + 1
return len(context)
"""

MB = 1024 * 1024


@dataclass(frozen=True)
class Program:
    code: str
    context: dict[str, Any]
    expected: Any
    context_json: str = field(repr=False)
    #: The context encoded once for sandforge (per-key snapshot), as the floors reuse ``context_json``.
    snapshot: ContextSnapshot | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Workload:
    """A named list of programs; latency is measured per program execution."""

    name: str
    title: str
    programs: tuple[Program, ...]
    validate: bool = False  # run the guardrail validator before each execution (host side)
    context_bytes: int = 0
    notes: str = ""


def run_plain(code: str, context: dict[str, Any]) -> Any:
    """The reference result: the program as a plain Python function (trusted: our own fixed programs)."""
    namespace: dict[str, Any] = {}
    exec(function_source(code), namespace)  # fixed benchmark programs only
    return namespace["_sf_program"](context, [], {})


def function_source(code: str) -> str:
    return "def _sf_program(context, args, kwargs):\n" + textwrap.indent(code, "    ") + "\n"


def script(code: str, *, context_literal: str | None = None) -> str:
    """A standalone script with the program contract: reads the context JSON from stdin (or the embedded
    literal), prints one JSON object: value, new context, and the peak RSS of the process running it.

    The peak is ``VmHWM`` of this process image, not ``ru_maxrss``: a child started with vfork+exec (as
    ``subprocess`` does) inherits its parent's RSS high-water mark in ``ru_maxrss``."""
    source = "json.loads(sys.stdin.read() or '{}')" if context_literal is None else f"json.loads({context_literal!r})"
    return (
        "import json, resource, sys\n"
        + function_source(code)
        + f"_sf_context = {source}\n"
        + "_sf_value = _sf_program(_sf_context, [], {})\n"
        + "try:\n"
        + "    _sf_rss = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
        + "except Exception:\n"
        + "    _sf_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        + "sys.stdout.write(json.dumps({'value': _sf_value, 'context': _sf_context, 'maxrss_kb': _sf_rss}))\n"
    )


def program(code: str, context: dict[str, Any] | None = None) -> Program:
    from sandforge.sandbox.context import ContextSnapshot

    ctx = context or {}
    expected = run_plain(code, json.loads(json.dumps(ctx)))
    return Program(code=code, context=ctx, expected=expected, context_json=json.dumps(ctx, separators=(",", ":")),
                   snapshot=ContextSnapshot.from_dict(ctx))  # fmt: skip


def context_of_size(target_bytes: int) -> dict[str, Any]:
    """Deterministic rows of mixed JSON types until the serialized context reaches ``target_bytes``."""
    rows: list[dict[str, Any]] = []
    size = len('{"rows":[]}')
    while True:
        row = _row(len(rows))
        step = len(json.dumps(row, separators=(",", ":"))) + (1 if rows else 0)
        if rows and size + step > target_bytes:
            return {"rows": rows}
        rows.append(row)
        size += step


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"item-{i:07d}", "score": round(i * 0.37, 2), "tags": ["a", "bc"], "ok": i % 2 == 0}


def many_programs(count: int) -> tuple[Program, ...]:
    """``count`` different programs (distinct source text), cycling through a few shapes."""
    shapes = (
        "values = [i * {k} for i in range({n})]\nreturn sum(values)",
        "text = 'ab{k}c' * {n}\ncontext['length'] = len(text)\nreturn text.count('b')",
        "d = {{}}\nfor i in range({n}):\n    d[str(i)] = i * {k}\nreturn len(d) + d[str({n} - 1)]",
        "import math\nreturn math.factorial({k} + {n} % 7) % 1000007",
        "words = ['w{k}', 'x', 'y{n}'] * 3\ncontext['seen'] = sorted(set(words))\nreturn ','.join(words)",
        "def f(x):\n    return x * x + {k}\nreturn [f(i) for i in range({n} % 13)]",
        "total = 0\nfor i in range({n}):\n    if i % {k} == 0:\n        total = total + i\nreturn total",
        "pairs = {{str(i): i % {k} for i in range({n} % 50)}}\ncontext['pairs'] = pairs\nreturn len(pairs)",
    )
    out = []
    for index in range(count):
        shape = shapes[index % len(shapes)]
        k, n = index // len(shapes) + 2, 40 + index
        out.append(program(shape.format(k=k, n=n)))
    return tuple(out)


def build(quick: bool, *, many: int = 100) -> list[Workload]:
    """The workload list. ``quick`` shrinks the contexts and the program count (smoke-test setting)."""
    scale = 0.01 if quick else 1.0
    ctx1 = context_of_size(int(MB * scale))
    ctx10 = context_of_size(int(10 * MB * scale))
    count = 10 if quick else many
    return [
        Workload("trivial", "trivial program (`return 1 + 1`)", (program(TRIVIAL),)),
        Workload("cpu_50ms", f"CPU-bound, ~50 ms pure Python ({CPU_ITERATIONS:,} iterations)", (program(CPU_BOUND),)),
        Workload(
            "model_style",
            f"model-style program: a class with state, +=, unpacking, counting ({MODEL_STYLE_ITERATIONS:,} rounds)",
            (program(MODEL_STYLE),),
        ),
        Workload(
            "context_1mb",
            "context snapshot of 1 MB carried, one small key updated",
            (program(CARRY_PROGRAM, ctx1),),
            context_bytes=_size(ctx1),
        ),
        Workload(
            "context_10mb",
            "context snapshot of 10 MB carried, one small key updated",
            (program(CARRY_PROGRAM, ctx10),),
            context_bytes=_size(ctx10),
        ),
        Workload(
            "context_1mb_read_all",
            "context snapshot of 1 MB, all of it read, a key written back",
            (program(CONTEXT_PROGRAM, ctx1),),
            context_bytes=_size(ctx1),
        ),
        Workload(
            "context_10mb_read_all",
            "context snapshot of 10 MB, all of it read, a key written back",
            (program(CONTEXT_PROGRAM, ctx10),),
            context_bytes=_size(ctx10),
        ),
        Workload(
            "many_programs",
            f"{count} different programs in a row (validation + execution, nothing reused)",
            many_programs(count),
            validate=True,
        ),
    ]


def _size(ctx: dict[str, Any]) -> int:
    return len(json.dumps(ctx, separators=(",", ":")).encode())
