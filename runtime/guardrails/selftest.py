"""Runs a policy's own examples: every rule's must-trigger and must-not-trigger programs, and every
capability's tagged and untagged programs, against the *effective* policy (all layers applied)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.guardrails.engine import ENGINE_RULES, validate
from sandforge.runtime.guardrails.policy import Policy
from sandforge.runtime.guardrails.results import INVALID_CODE, ValidationResult

Expectation = Literal["trigger", "clean", "corrected", "tagged", "untagged"]
Subject = Literal["rule", "capability"]


class Example(BaseModel):
    """One example program and what it must do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: Subject
    id: str
    expectation: Expectation
    index: int
    source: str
    origin: str

    @property
    def name(self) -> str:
        return f"{self.subject} {self.id} {self.expectation}[{self.index}]"


class ExampleOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    example: Example
    passed: bool
    detail: str


def examples(policy: Policy) -> Iterator[Example]:
    """Every example of every enabled rule and of every capability, in policy order."""
    for rule in policy.active_rules:
        yield from _examples("rule", rule.id, str(rule.origin), "trigger", rule.spec.examples.trigger)
        yield from _examples("rule", rule.id, str(rule.origin), "clean", rule.spec.examples.clean)
        yield from _examples("rule", rule.id, str(rule.origin), "corrected", rule.spec.examples.corrected)
    for tag, definition in policy.capabilities.items():
        yield from _examples("capability", tag, str(definition.origin), "tagged", definition.tagged)
        yield from _examples("capability", tag, str(definition.origin), "untagged", definition.untagged)


def _examples(
    subject: Subject, name: str, origin: str, expectation: Expectation, programs: Sequence[str]
) -> Iterator[Example]:
    for index, source in enumerate(programs):
        yield Example(subject=subject, id=name, expectation=expectation, index=index, source=source, origin=origin)


def check_example(example: Example, policy: Policy) -> ExampleOutcome:
    """Validate one example and judge it; an example that does not parse always fails."""
    result = validate(example.source, policy)
    broken = next((v for v in result.violations if v.violation_type == INVALID_CODE), None)
    if broken is not None:
        return ExampleOutcome(example=example, passed=False, detail=f"example does not parse: {broken.message}")
    if example.subject == "rule":
        passed, detail = _judge_rule(example, result)
    else:
        tagged = example.id in result.capability_tags
        passed = tagged == (example.expectation == "tagged")
        found = ", ".join(result.capability_tags) or "none"
        detail = f"capabilities found: {found}"
    return ExampleOutcome(example=example, passed=passed, detail=detail)


def _judge_rule(example: Example, result: ValidationResult) -> tuple[bool, str]:
    hits = [v for v in result.violations if v.violation_type == example.id]
    if example.expectation == "trigger":
        if hits:
            return True, f"triggered: {hits[0].message}"
        others = ", ".join(sorted({v.violation_type for v in result.violations})) or "nothing"
        return False, f"did not trigger (found: {others})"
    if hits:
        where = f"line {hits[0].location.line}: " if hits[0].location else ""
        return False, f"triggered: {where}{hits[0].message}"
    refused = sorted({v.violation_type for v in result.violations if v.violation_type in ENGINE_RULES})
    if example.expectation == "corrected" and refused:
        # No policy can lift these (the sandbox's own compiler, limits): the suggested correction cannot run.
        return False, f"the corrected program is refused whatever the policy (found: {', '.join(refused)})"
    return True, "did not trigger"


def run_examples(policy: Policy) -> list[ExampleOutcome]:
    return [check_example(example, policy) for example in examples(policy)]
