"""ScriptedProvider: replay in order, record every request and prompt, scripts from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandforge.runtime.errors import UsageError
from sandforge.runtime.providers import (
    GeneratedProgram,
    GenerationRequest,
    InvalidProviderOutput,
    ProviderError,
    ScriptedProvider,
)


def req(method: str = "add") -> GenerationRequest:
    return GenerationRequest(role="calc", method=method, args=[1])


def test_replays_in_order_and_records_requests_and_prompts() -> None:
    p = ScriptedProvider(["return 1", GeneratedProgram(code="return 2", dependencies=["math"])])
    first, second = p.generate(req("a")), p.generate(req("b"))
    assert (first.code, second.code) == ("return 1", "return 2")
    assert second.dependencies == ["math"] and second.provider == "scripted"
    assert [r.method for r in p.requests] == ["a", "b"]
    assert p.calls == 2 and p.remaining == 0
    assert "calc.a(1)" in p.prompts[0].user and "calc.b(1)" in p.prompts[1].user
    assert "BODY of a function" in p.prompts[0].system


def test_exhausted_script_is_a_non_retriable_provider_error() -> None:
    p = ScriptedProvider(["return 1"])
    p.generate(req())
    with pytest.raises(ProviderError) as info:
        p.generate(req())
    assert not info.value.retriable and info.value.kind == "script_exhausted"
    assert p.calls == 2  # the failed request is recorded too


def test_exception_items_are_raised() -> None:
    p = ScriptedProvider([InvalidProviderOutput("no tool call"), "return 3"])
    with pytest.raises(InvalidProviderOutput):
        p.generate(req())
    assert p.generate(req()).code == "return 3"


def test_text_script_file(tmp_path: Path) -> None:
    path = tmp_path / "script.py"
    path.write_text("context['a'] = 1\nreturn 1\n# ---\nreturn 2\n# ---\n\n")
    p = ScriptedProvider(path)
    assert p.remaining == 2
    assert p.generate(req()).code == "context['a'] = 1\nreturn 1\n"
    assert p.generate(req()).code == "return 2\n"


def test_json_script_file(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(["return 1", {"code": "return 2", "dependencies": ["math"]}]))
    p = ScriptedProvider(str(path))
    assert p.generate(req()).code == "return 1"
    assert p.generate(req()).dependencies == ["math"]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"code": "x"}), json.dumps([3])])
def test_bad_json_script_is_a_usage_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UsageError):
        ScriptedProvider(path)


def test_missing_script_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        ScriptedProvider(tmp_path / "missing.txt")
