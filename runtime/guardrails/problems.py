"""Every problem of a policy, reported at once (issue 23): a malformed policy lists all its mistakes, sorted by
file and line, the way linters do, instead of the first one and a count.

The loader collects `Problem`s while it reads and layers every file (a broken rule is left out, the rest is
still checked), then raises one `PolicyError` carrying them all. Its message is one line (the first problem
and what follows, for the commands that print an ``error:`` line); ``sandforge policy lint`` prints one
problem a line, as JSON or as SARIF.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.errors import ConfigError

#: How many problems one load reports at most (a generated file with thousands of mistakes stays readable).
MAX_PROBLEMS = 200


@dataclass(frozen=True, slots=True)
class Problem:
    """One mistake in a policy: where (file, 1-based line, the key path inside the file) and what to do."""

    file: str
    line: int
    path: str
    message: str
    hint: str | None = None
    order: int = 0  # the file's position in load order (layers in order, files in path order)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file else ""
        text = f"{where}{self.path + ': ' if self.path else ''}{self.message}"
        text = f"{text} (hint: {self.hint})" if self.hint else text
        return " ".join(text.split())  # one line whatever a key or a file name holds (no forged `error:` lines)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "path": self.path, "message": self.message, "hint": self.hint}


class PolicyError(ConfigError):
    """A policy that does not load, with every problem found (``problems``, sorted by file and line)."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        ordered = sort_problems(problems)
        self.problems = tuple(ordered)
        first = ordered[0]
        more = len(ordered) - 1
        tail = ""
        if more:
            rest = "; ".join(str(p) for p in ordered[1:4]) + ("; ..." if more > 3 else "")
            tail = f" (and {more} more problem{'s' if more > 1 else ''}, all listed by `sandforge policy lint`: {rest})"
        text = f"{first.file}:{first.line}: " if first.file else ""
        text += f"{first.path + ': ' if first.path else ''}{first.message}{tail}"
        super().__init__(text, hint=first.hint)


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    """In load order (layer, then file path), then by line; duplicates dropped."""
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: (p.order, p.file, p.line, p.path))[:MAX_PROBLEMS]


_LOCATED = re.compile(r"^(?P<line>\d+): (?P<rest>.*)$", re.DOTALL)


def from_config_error(exc: ConfigError, file: str, order: int) -> Problem:
    """A `ConfigError` raised for ``file`` (``"file:line: message"`` or ``"file: message"``) as a `Problem`."""
    message = exc.message
    line = 1
    if message.startswith(file + ":"):
        rest = message[len(file) + 1 :].lstrip()
        located = _LOCATED.match(rest)
        if located is not None:
            line, message = int(located["line"]), located["rest"]
        else:
            message = rest
    return Problem(file, line, "", " ".join(message.split()), exc.hint, order)


# ------------------------------------------------------------------------------------------ renderings


def render_text(problems: Iterable[Problem]) -> str:
    return "\n".join(f"error: {problem}" for problem in problems)


def render_json(problems: Iterable[Problem]) -> dict[str, Any]:
    listed = [problem.to_json() for problem in problems]
    return {"ok": not listed, "problems": listed}


def render_sarif(problems: Iterable[Problem], version: str) -> dict[str, Any]:
    """SARIF 2.1.0: one result per problem, rule ``policy_problem``, the key path in ``properties``."""
    results = []
    for problem in problems:
        physical: dict[str, Any] = {"artifactLocation": {"uri": problem.file or "<policy>"}}
        physical["region"] = {"startLine": problem.line}
        entry: dict[str, Any] = {
            "ruleId": "policy_problem",
            "ruleIndex": 0,
            "level": "error",
            "message": {"text": f"{problem.path + ': ' if problem.path else ''}{problem.message}"},
            "locations": [{"physicalLocation": physical}],
            "properties": {"path": problem.path, "hint": problem.hint},
        }
        results.append(entry)
    rule = {
        "id": "policy_problem",
        "shortDescription": {"text": "A policy file is malformed or refers to something no layer defines."},
        "help": {"text": "Fix the file at the line given; `sandforge policy schema` prints the file format."},
        "defaultConfiguration": {"level": "error"},
    }
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {"tool": {"driver": {"name": "sandforge-policy", "version": version, "rules": [rule]}}, "results": results}
        ],
    }
