"""Exit statuses of every command (issue 21), one meaning each, and how errors are reported.

| status | meaning |
|---|---|
| 0 | ok |
| 1 | the program (or the checked thing: a backend, a tool) failed |
| 2 | usage error: a bad flag or value, an unreadable or malformed input or configuration file |
| 3 | rejected by the policy, recoverable (a corrected program may pass) |
| 4 | rejected by the policy, terminal (no program doing this will pass) |
| 5 | a timeout or resource limit ended the program (wall clock, memory, output) |
| 6 | the sandbox or its engine is unavailable |
| 7 | a file sandforge had to write or lock could not be (disk full, read-only, lock timeout); left as it was |
| 130 | interrupted (Ctrl-C) |

Under ``--json`` an error is one JSON object on standard error:
``{"error": {"type": ..., "message": ..., "exit_code": N, "hint": ...}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from contextvars import ContextVar
from enum import IntEnum
from typing import Any

import click

from sandforge.runtime.errors import SandforgeError


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    REJECTED_RECOVERABLE = 3
    REJECTED_TERMINAL = 4
    LIMIT = 5
    UNAVAILABLE = 6
    FILE_IO = 7
    INTERRUPTED = 130


#: Execution error types that are a limit of the sandbox (exit 5) or its absence (exit 6).
LIMIT_ERRORS = frozenset({"timeout", "memory_limit", "output_limit"})
UNAVAILABLE_ERRORS = frozenset({"sandbox_unavailable"})
#: Policy rejections: the verdict (in the outcome's metadata) says recoverable (3) or terminal (4). A
#: program's dependency manifest refused (malformed, or naming what the policy's ``dependencies`` does not
#: allow) is one: nothing ran and a corrected program may pass.
REJECTION_ERRORS = frozenset(
    {"guardrail_violation", "invalid_code", "invalid_dependency_manifest", "dependency_policy_violation"}
)


def for_outcome(ok: bool, error_type: str | None, verdict: object = None) -> Exit:
    """The exit status of one execution's outcome (``sandforge exec``)."""
    if ok:
        return Exit.OK
    if error_type in LIMIT_ERRORS:
        return Exit.LIMIT
    if error_type in UNAVAILABLE_ERRORS:
        return Exit.UNAVAILABLE
    if error_type in REJECTION_ERRORS and verdict in ("recoverable", "terminal"):
        return Exit.REJECTED_RECOVERABLE if verdict == "recoverable" else Exit.REJECTED_TERMINAL
    return Exit.FAILED


#: Whether the command line asked for ``--json`` (set by the root group before parsing: usage errors too).
JSON_ERRORS: ContextVar[bool] = ContextVar("sandforge_json_errors", default=False)


def json_requested(argv: Sequence[str]) -> bool:
    """``--json`` among the arguments (before a ``--``)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def report(kind: str, message: str, code: int, hint: str | None = None) -> None:
    """One error on standard error: a JSON object under ``--json``, else one ``error: ...`` line."""
    message = " ".join(message.split())
    if JSON_ERRORS.get():
        error: dict[str, Any] = {"type": kind, "message": message, "exit_code": code}
        if hint:
            error["hint"] = hint
        click.echo(json.dumps({"error": error}, ensure_ascii=False), err=True)
    else:
        click.echo(f"error: {message}" + (f" (hint: {hint})" if hint else ""), err=True)


def report_sandforge(exc: SandforgeError) -> int:
    report(_snake(type(exc).__name__), exc.message, exc.exit_code, exc.hint)
    return exc.exit_code


def report_click(exc: click.ClickException) -> int:
    """A click usage error (unknown option, bad value, missing argument): JSON under --json, else click's text."""
    if not JSON_ERRORS.get():
        exc.show()
        return exc.exit_code
    kind = "usage_error" if isinstance(exc, click.UsageError) else _snake(type(exc).__name__)
    report(kind, exc.format_message(), exc.exit_code)
    return exc.exit_code
