"""Attribute reads inside the sandbox follow Python: a missing attribute raises, it is never ``None``.

RestrictedPython's ``safer_getattr`` defaults to ``None``; a tool computing with that ``None`` would be
silently wrong (and ``hasattr`` would always be true).
"""

from __future__ import annotations

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox


@pytest.mark.parametrize(
    ("code", "value"),
    [
        ('return hasattr(1, "foo")', False),
        ('return hasattr("x", "upper")', True),
        ('return getattr(1, "foo", 5)', 5),
        ('import json\nreturn [hasattr(json, "nope"), hasattr(json, "dumps")]', [False, True]),
        ("import math\nreturn math.floor(2.5)", 2),
    ],
)
def test_present_and_missing_attributes(sandbox: Sandbox, code: str, value: object) -> None:
    out = sandbox.execute(ExecutionRequest(code=code))
    assert out.ok, out.error_message
    assert out.value == value


@pytest.mark.parametrize("code", ["return (1).foo", 'return getattr(1, "foo")', "import json\nreturn json.nope"])
def test_a_missing_attribute_raises(sandbox: Sandbox, code: str) -> None:
    out = sandbox.execute(ExecutionRequest(code=code))
    assert out.error_type == ErrorType.EXECUTION
    assert "AttributeError" in (out.error_message or "")


@pytest.mark.parametrize("code", ["import json\nreturn json.load", 'import json\nreturn hasattr(json, "load")'])
def test_a_withheld_name_is_a_violation(sandbox: Sandbox, code: str) -> None:
    """Withheld names are not merely missing: reading one is a sandbox violation (tests/sandbox/test_inner_wall.py)."""
    out = sandbox.execute(ExecutionRequest(code=code))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION
    assert "json.load is withheld" in (out.error_message or "")


def test_underscore_names_stay_forbidden(sandbox: Sandbox) -> None:
    out = sandbox.execute(ExecutionRequest(code='return getattr(1, "__class__", 3)'))
    assert not out.ok and "invalid attribute name" in (out.error_message or "")
