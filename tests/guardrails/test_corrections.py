"""One verdict, second half (issue 15): every correction the policy suggests is itself approved and runs.

A rule's ``required_correction`` is what a model is told to do; each recoverable rule carries
``examples.corrected``, trigger programs rewritten as that text says (``policy explain`` shows the first
under "Use instead"). A correction the whole policy refuses, or the sandbox refuses or fails, sends the model
from one repair to the next, so each corrected program must be approved by the whole default policy and run
to a successful result in the real sandbox (subprocess backend). The lists the correction text names
(allowed modules, allowed decorators, allowed special methods) are checked against the matcher and the
corrected programs, so the prose cannot promise what the policy or the sandbox refuses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.guardrails.policy import Policy
from sandforge.runtime.guardrails.selftest import Example, check_example, examples
from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig

POLICY: Policy = default_policy()
CORRECTED = [e for e in examples(POLICY) if e.expectation == "corrected"]


def _rule(rule_id: str) -> Any:
    return next(r for r in POLICY.active_rules if r.id == rule_id)


def _echo(call: Any) -> dict[str, Any]:
    """A tool that answers every call with what it was asked: corrections that say "use tool(...)" run too."""
    return {"status": "ok", "value": {"method": call.method, "kwargs": call.kwargs}}


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=2)) as sandbox:
        yield sandbox


def test_every_recoverable_rule_shows_its_correction_as_a_program() -> None:
    missing = [
        r.id for r in POLICY.active_rules if r.spec.classification == "recoverable" and not r.spec.examples.corrected
    ]
    assert not missing, f"rules whose correction has no corrected example: {missing}"
    assert len({e.id for e in CORRECTED}) >= 20


@pytest.mark.parametrize("example", CORRECTED, ids=[e.name.replace(" ", ":") for e in CORRECTED])
def test_every_corrected_program_is_approved_and_runs(sb: Sandbox, example: Example) -> None:
    outcome = check_example(example, POLICY)
    assert outcome.passed, outcome.detail
    result = validate(example.source, POLICY)
    assert result.verdict == "approved", [(v.violation_type, v.message) for v in result.violations]
    out = sb.execute(ExecutionRequest(code=example.source), bridge=_echo)
    if "Outcome.error(" in example.source and out.error_type == ErrorType.TOOL_ERROR:
        # Corrections say "report it through Outcome.error(...)": the program's deliberate answer, its own type.
        assert f'Outcome.error("{out.metadata.get("tool_error_type")}"' in example.source, out.metadata
        return
    assert out.status == "ok" and out.error_type is None, (out.error_type, out.error_message)


def test_a_correction_the_sandbox_compiler_refuses_fails_policy_test() -> None:
    """`policy test` judges a corrected example by its own rule and by what no policy can lift (a stricter
    layer may refuse what the default suggests; the test above holds the default policy to full approval)."""
    source = "try:\n    pass\nexcept* ValueError:\n    pass\nreturn 1"
    broken = Example(subject="rule", id="loader_access", expectation="corrected", index=0, source=source, origin="t")
    outcome = check_example(broken, POLICY)
    assert not outcome.passed and "sandbox_restriction" in outcome.detail
    clean = broken.model_copy(update={"expectation": "clean"})
    assert check_example(clean, POLICY).passed


def _named_list(text: str, pattern: str) -> list[str]:
    found = re.search(pattern, text, re.S)
    assert found, f"the correction no longer has the list the test reads: {text!r}"
    listed = re.sub(r"\([^)]*\)", "", found.group(1))
    return [name.strip() for name in re.split(r",\s*|\s+and\s+", listed) if name.strip()]


MODULES = _named_list(_rule("module_not_allowed").spec.required_correction, r"modules \((.*?)\), or delegate")


@pytest.mark.parametrize("module", MODULES)
def test_every_module_the_correction_offers_is_approved_and_imports(sb: Sandbox, module: str) -> None:
    package, _, name = module.rpartition(".")
    source = f"from {package} import {name}\nreturn 1" if module == "io.StringIO" else f"import {module}\nreturn 1"
    result = validate(source, POLICY)
    assert result.verdict == "approved", [(v.violation_type, v.message) for v in result.violations]
    out = sb.execute(ExecutionRequest(code=source))
    assert out.status == "ok", (out.error_type, out.error_message)


def test_the_decorators_the_correction_allows_are_the_matchers_and_each_runs_in_a_corrected_program() -> None:
    rule = _rule("decorator_call")
    named = set(_named_list(rule.spec.required_correction, r"Allowed decorators: the program's own, (.*?)\.$"))
    exempt = {g for g in rule.spec.match.except_ if "*" not in g}
    assert named == exempt, f"correction and matcher disagree: {sorted(named ^ exempt)}"
    used = {m for e in rule.spec.examples.corrected for m in re.findall(r"^\s*@([\w.]+)", e, re.M)}
    assert named <= used, f"allowed decorators no corrected example runs: {sorted(named - used)}"
    assert any(u.endswith(".setter") for u in used), "the correction allows property setters; none runs"


def test_the_special_methods_the_correction_keeps_are_defined_in_a_corrected_program() -> None:
    rule = _rule("dunder_definition")
    named = set(re.findall(r"__\w+?__", rule.spec.required_correction.split("such as", 1)[1]))
    assert named <= set(rule.spec.match.except_), sorted(named - set(rule.spec.match.except_))
    defined = {m for e in rule.spec.examples.corrected for m in re.findall(r"def (__\w+__)\(", e)}
    assert named <= defined, f"special methods the correction keeps, defined by no corrected example: {named - defined}"
