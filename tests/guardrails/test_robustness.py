"""Validation never crashes and always answers with a typed verdict, whatever the input."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandforge.runtime.guardrails import ValidationResult, clear_cache, default_policy, layered_policy, validate
from sandforge.runtime.guardrails import engine as engine_module
from sandforge.runtime.guardrails.plugins import tool_mutation

POLICY = default_policy()


def only(result: ValidationResult) -> str:
    assert len(result.violations) == 1, result.violations
    return result.violations[0].violation_type


# ------------------------------------------------------------------------------------ pathological


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("(" * 100_000 + ")" * 100_000, "invalid_code", id="parentheses beyond the tokenizer"),
        pytest.param("x = " + "-" * 100_000 + "1", "nesting_too_deep", id="unary chain beyond the parser"),
        pytest.param("x = " + "not " * 50_000 + "y", "nesting_too_deep", id="not chain"),
        pytest.param("x = " + "+".join(["1"] * 60_000), "nesting_too_deep", id="binop chain beyond ast"),
        pytest.param("x = " + "+".join(["1"] * 300), "nesting_too_deep", id="binop chain beyond max_ast_depth"),
        pytest.param("x = a" + "[0]" * 30_000, "nesting_too_deep", id="subscript chain"),
        pytest.param(
            "".join("    " * i + "if x:\n" for i in range(120)) + "    " * 120 + "pass\n",
            "invalid_code",
            id="indentation beyond the tokenizer",
        ),
    ],
)
def test_deep_nesting_gets_a_typed_verdict(source: str, expected: str) -> None:
    result = validate(source, POLICY)
    assert only(result) == expected
    assert result.verdict == "recoverable"


def test_depth_violation_points_at_the_deep_node_and_rules_still_run() -> None:
    source = "import os\nx = " + "+".join(["1"] * 300) + "\n"
    result = validate(source, POLICY)
    kinds = {v.violation_type for v in result.violations}
    assert kinds == {"nesting_too_deep", "forbidden_module"}
    deep = next(v for v in result.violations if v.violation_type == "nesting_too_deep")
    assert deep.location is not None and deep.location.line == 2


def test_nesting_just_inside_the_limits_is_analysed() -> None:
    chain = "x = args" + ".a" * 150 + ".__class__"
    result = validate(chain, POLICY)
    assert [v.violation_type for v in result.violations] == ["dunder_attribute"]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_megabytes_are_refused_before_parsing(as_bytes: bool) -> None:
    source = "x = 1\n" * 500_000
    result = validate(source.encode() if as_bytes else source, POLICY)
    assert only(result) == "source_too_large"
    assert str(len(source)) in result.violations[0].message


def test_size_limit_counts_utf8_bytes() -> None:
    limit = POLICY.limits.max_source_bytes
    source = "x = '" + "é" * (limit // 2) + "'"  # fewer characters than the limit, more bytes
    assert len(source) < limit < len(source.encode())
    assert only(validate(source, POLICY)) == "source_too_large"


@pytest.mark.parametrize("source", ["x = 1\0", b"x = 1\n\0y = 2"])
def test_nul_bytes(source: str | bytes) -> None:
    result = validate(source, POLICY)
    assert only(result) == "invalid_code"
    assert "NUL" in result.violations[0].message
    assert result.violations[0].location is not None


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (b"x = 1\ny = '\xff'\n", 2),
        ("x = 'é'".encode("latin-1"), 1),
        ("x = 1".encode("utf-16"), 1),
    ],
)
def test_non_utf8_bytes(source: bytes, line: int) -> None:
    result = validate(source, POLICY)
    assert only(result) == "invalid_code"
    location = result.violations[0].location
    assert location is not None and location.line == line


def test_utf8_bom_in_bytes_is_dropped() -> None:
    result = validate(codecs.BOM_UTF8 + b"return len(args)\n", POLICY)
    assert result.verdict == "approved"


def test_bom_inside_text_is_what_python_rejects() -> None:
    assert only(validate("\ufeffreturn 1", POLICY)) == "invalid_code"


@pytest.mark.parametrize(
    "source",
    [
        b"# -*- coding: latin-1 -*-\nx = 1\n",
        "# coding: utf-7\nx = 1\n",
        b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\nx = 1\n",
        b"# coding: no-such-codec\nx = 1\n",
    ],
)
def test_non_utf8_coding_declarations(source: str | bytes) -> None:
    result = validate(source, POLICY)
    assert only(result) == "invalid_code"
    assert "coding" in result.violations[0].message or "encoding" in result.violations[0].message


def test_utf8_coding_declaration_is_fine() -> None:
    assert validate(b"# -*- coding: utf-8 -*-\nreturn 1\n", POLICY).verdict == "approved"


def test_lone_surrogate() -> None:
    assert only(validate("x = '\ud800'", POLICY)) == "invalid_code"


@pytest.mark.parametrize("source", [None, 42, ["import os"]])
def test_wrong_input_types_do_not_raise(source: object) -> None:
    assert only(validate(source, POLICY)) == "invalid_code"  # type: ignore[arg-type]


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_bytes_like_inputs(wrap: type) -> None:
    result = validate(wrap(b"import os\n"), POLICY)
    assert [v.violation_type for v in result.violations] == ["forbidden_module"]


def test_syntax_error_location() -> None:
    result = validate("x = 1\ny = (\n", POLICY)
    assert only(result) == "invalid_code"
    location = result.violations[0].location
    assert location is not None and location.line == 2
    assert result.violations[0].classification == "recoverable"


def test_function_body_constructs_parse() -> None:
    source = "if not args:\n    return Outcome.error('invalid_input', 'none')\nreturn args[0]\n"
    assert validate(source, POLICY).verdict == "approved"


@pytest.mark.parametrize("newline", ["\r\n", "\r", "\n"])
def test_line_numbers_with_any_newline(newline: str) -> None:
    source = newline.join(["x = 1", "y = 2", "z = args.__class__", ""])
    result = validate(source, POLICY)
    violation = result.violations[0]
    assert violation.location is not None
    assert (violation.location.line, violation.location.source_line) == (3, "z = args.__class__")


def test_violations_are_capped() -> None:
    result = validate("eval('1')\n" * 500, POLICY)
    assert len(result.violations) == POLICY.limits.max_violations
    assert result.truncated
    assert [v.location.line for v in result.violations if v.location] == list(range(1, 101))


# ---------------------------------------------------------------------------------- internal errors


def test_a_crashing_rule_is_a_terminal_guardrail_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object) -> object:
        raise RuntimeError("boom")

    plugin = next(r.matcher for r in POLICY.rules if r.id == "delegated_tool_mutation")
    monkeypatch.setattr(plugin, "find", explode)
    clear_cache()
    result = validate("import os\n", POLICY)
    kinds = {v.violation_type: v.classification for v in result.violations}
    assert kinds == {"guardrail_error": "terminal", "forbidden_module": "recoverable"}
    assert result.verdict == "terminal"
    assert tool_mutation.delegated_tool_mutation.__doc__  # the real plugin is untouched


def test_a_crashing_engine_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object, **__: object) -> object:
        raise MemoryError

    monkeypatch.setattr(engine_module, "Program", explode)
    clear_cache()
    result = validate("x = 1", POLICY)
    assert only(result) == "guardrail_error"
    assert result.verdict == "terminal"
    monkeypatch.undo()
    assert validate("x = 1", POLICY).verdict == "approved"  # the failure was not cached


def test_results_are_cached_by_text_and_effective_policy(tmp_path: Path) -> None:
    source = "import os\n"
    first = validate(source, POLICY)
    assert validate(source, POLICY) is first
    assert validate(source.encode(), POLICY) is not first
    assert validate(source.encode(), POLICY) == first
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "p.yaml").write_text("override:\n  forbidden_module:\n    classification: terminal\n")
    stricter = validate(source, layered_policy([layer]))
    assert stricter.verdict == "terminal" and first.verdict == "recoverable"


# ------------------------------------------------------------------------------------- properties

CODE_FRAGMENTS = [
    "import os",
    "from json import loads as l",
    "x = getattr(args, 'a')",
    "t = tool('x')",
    "t.f = 1",
    "context['k'] = lambda: 1",
    "class A(B, metaclass=M):",
    "def f(a=os, *b, **c):",
    "    return a.b.c()",
    "match x:",
    "    case C(a=1, __class__=c): pass",
    "@dec",
    "for m in (json, os): m.system()",
    "'{0.__class__}'.format(x)",
    "a = b = c = a",
    "(yield)",
    "lambda: (yield)",
    "x: int = __import__('os')",
    "[i for i in (j := k)]",
    "f'{x!r:{y.__dict__}}'",
    "with open(p) as (a, b):",
    "try:\n  pass\nexcept* E as e:\n  pass",
    "del a.b, c[d]",
    "global g",
    "async def g():\n    async for x in y: await z",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_validate_never_raises_on_text(source: str) -> None:
    result = validate(source, POLICY)
    assert result.verdict in ("approved", "recoverable", "terminal")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary())
def test_validate_never_raises_on_bytes(source: bytes) -> None:
    result = validate(source, POLICY)
    assert result.verdict in ("approved", "recoverable", "terminal")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(CODE_FRAGMENTS), max_size=12), st.sampled_from(["\n", "\n    ", "; ", " "]))
def test_validate_never_raises_on_code_like_text(fragments: list[str], joiner: str) -> None:
    source = joiner.join(fragments)
    first = validate(source, POLICY)
    assert first.verdict in ("approved", "recoverable", "terminal")
    assert all(v.violation_type != "guardrail_error" for v in first.violations), first.violations
    assert validate(source.encode(), POLICY) == first  # bytes and text agree, and validation is deterministic
