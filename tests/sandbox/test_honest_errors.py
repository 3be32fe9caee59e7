"""Honest program errors are the program's errors, never ``sandbox_violation`` (issue 13, item 10).

A value nested deeper than the host parses, a long exception class name, and a lone surrogate in printed
output, an error message, a context key or the value each used to break the result frame: the host then saw
a protocol violation, or the whole result was replaced and stdout dropped. On every backend."""

from __future__ import annotations

from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, Sandbox

LIMITS = Limits(timeout_s=10)


def run(sb: Sandbox, code: str, context: dict[str, Any] | None = None) -> ExecutionOutcome:
    return sb.execute(ExecutionRequest(code=code, context=context or {}, limits=LIMITS))


def nested(levels: int) -> str:
    return f"v = []\nfor i in range({levels - 1}):\n    v = [v]\n"


def test_the_deepest_value_round_trips_and_one_more_is_the_programs_error(sandbox: Sandbox) -> None:
    out = run(sandbox, nested(200) + "return v")
    assert out.ok, (out.error_type, out.error_message)
    depth, value = 0, out.value
    while isinstance(value, list):
        depth, value = depth + 1, value[0] if value else None
    assert depth == 200
    out = run(sandbox, nested(201) + "print('kept')\nreturn v")
    assert out.error_type == ErrorType.NON_SERIALIZABLE_RESULT, (out.error_type, out.error_message)
    assert "200 levels" in (out.error_message or "") and out.stdout.startswith("kept")
    out = run(sandbox, nested(201) + "context['deep'] = v\nreturn 1")
    assert out.error_type == ErrorType.NON_SERIALIZABLE_RESULT, (out.error_type, out.error_message)


def test_a_nested_call_argument_too_deep_is_the_programs_error(sandbox: Sandbox) -> None:
    out = run(sandbox, nested(300) + "return tool('helper').run(v)")
    assert out.error_type not in (ErrorType.SANDBOX_VIOLATION, None), (out.error_type, out.error_message)


def test_a_long_exception_class_name_is_truncated(sandbox: Sandbox) -> None:
    name = "E" * 5000
    out = run(sandbox, f"class {name}(Exception):\n    pass\nprint('kept')\nraise {name}('boom')")
    assert out.error_type == ErrorType.EXECUTION, (out.error_type, out.error_message)
    assert out.metadata["exception"] == "E" * 200 and out.stdout.startswith("kept")


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("print('a\\udc80b')\nreturn 1", None),
        ("print('kept')\nraise ValueError('bad \\ud800 text')", ErrorType.EXECUTION),
        ("print('kept')\ncontext['k\\udc80'] = 1\nreturn 1", ErrorType.NON_SERIALIZABLE_RESULT),
        ("print('kept')\nreturn {'k\\udc80': 1}", ErrorType.NON_SERIALIZABLE_RESULT),
        ("print('kept')\nreturn 'v\\udc80'", ErrorType.NON_SERIALIZABLE_RESULT),
    ],
    ids=["print", "message", "context key", "value key", "value"],
)
def test_a_lone_surrogate_never_drops_stdout(sandbox: Sandbox, code: str, error: ErrorType | None) -> None:
    out = run(sandbox, code)
    assert out.error_type == error, (out.error_type, out.error_message)
    assert out.stdout.startswith("a?b" if error is None else "kept"), out.stdout
    if error == ErrorType.EXECUTION:
        assert "bad ? text" in (out.error_message or "")
