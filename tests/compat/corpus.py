"""The compatibility corpus: tool programs written the way models write them, and plain CPython's answers.

Each ``programs/*.py`` file is a program body (``context``, ``args``, ``kwargs`` in scope, ``return`` gives
the result) with optional header comments ``# args: JSON``, ``# kwargs: JSON``, ``# context: JSON``. The
expected result is never stored: ``reference`` runs every program under plain ``python3`` (no sandbox, no
RestrictedPython) in one subprocess, so the answer is what CPython says today.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROGRAMS = Path(__file__).parent / "programs"

#: Runs inside the plain-CPython subprocess: each program as the body of a function, like the sandbox does.
_REFERENCE = r"""
import json, sys, textwrap, io, contextlib

class _Outcome:
    def __init__(self, ok, value=None, error_type=None):
        self.ok, self.value, self.error_type = ok, value, error_type

class Outcome:
    @staticmethod
    def ok(value=None):
        return _Outcome(True, value)

    @staticmethod
    def error(error_type, message="", retriable=False):
        return _Outcome(False, None, error_type)

def run(program):
    source = "def sandforge_tool(context, args, kwargs):\n" + textwrap.indent(program["code"], "    ") + "\n"
    namespace = {"__name__": "sandforge_tool", "Outcome": Outcome}
    exec(compile(source, "<tool>", "exec"), namespace)
    context = json.loads(json.dumps(program["context"]))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            value = namespace["sandforge_tool"](context, program["args"], program["kwargs"])
    except Exception as exc:
        return {"status": "error", "error_type": "execution", "exception": type(exc).__name__}
    if isinstance(value, _Outcome):
        if not value.ok:
            return {"status": "error", "error_type": "tool_error", "tool_error_type": value.error_type}
        value = value.value
    return {"status": "ok", "value": json.loads(json.dumps(value)), "context": json.loads(json.dumps(context))}

programs = json.load(sys.stdin)
print(json.dumps({p["name"]: run(p) for p in programs}))
"""


@dataclass(frozen=True)
class Program:
    name: str
    code: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)


def load() -> list[Program]:
    """Every program of the corpus, in name order."""
    programs = []
    for path in sorted(PROGRAMS.glob("*.py")):
        code = path.read_text(encoding="utf-8")
        header: dict[str, Any] = {}
        for line in code.splitlines():
            if not line.startswith("# ") or ":" not in line:
                break
            key, _, value = line[2:].partition(":")
            if key.strip() in ("args", "kwargs", "context"):
                header[key.strip()] = json.loads(value)
        programs.append(Program(path.stem, code, **header))
    return programs


def reference(programs: list[Program], python: str | None = None) -> dict[str, dict[str, Any]]:
    """What plain CPython returns for each program (JSON-normalized, as any JSON boundary sends it)."""
    payload = json.dumps([{"name": p.name, "code": p.code, "args": p.args, "kwargs": p.kwargs,
                           "context": p.context} for p in programs])  # fmt: skip
    done = subprocess.run([python or sys.executable, "-I", "-c", _REFERENCE], input=payload, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


@dataclass
class Verdict:
    """How the sandbox's answer compares with CPython's: pass, refused/failed (the sandbox said no), or wrong."""

    name: str
    kind: str  # "pass" | "fail" | "wrong"
    detail: str = ""


def judge(name: str, expected: dict[str, Any], outcome: Any) -> Verdict:
    """Compare a sandbox ExecutionOutcome with CPython's answer."""
    if expected["status"] == "error":
        want = expected.get("tool_error_type")
        if not outcome.ok and outcome.error_type == expected["error_type"]:
            return Verdict(name, "pass")
        if outcome.ok:
            return Verdict(name, "wrong", f"CPython failed ({want or expected.get('exception')}), sandbox returned")
        return Verdict(name, "fail", f"{outcome.error_type}: {outcome.error_message}")
    if not outcome.ok:
        return Verdict(name, "fail", f"{outcome.error_type}: {outcome.error_message}")
    if outcome.value != expected["value"] or outcome.context != expected["context"]:
        return Verdict(name, "wrong", f"value {outcome.value!r} != {expected['value']!r}")
    return Verdict(name, "pass")
