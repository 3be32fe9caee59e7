"""Runs a policy's own examples: every rule's must-trigger and must-not-trigger programs, every capability's
tagged and untagged programs, and the sections' examples (egress requests, dependency manifests), against the
*effective* policy (all layers applied).

An example is written in one layer, under the grants that layer had. When a later layer grants (or denies) a
capability the example uses, what the example expects may no longer hold: ``import urllib.request`` cannot show
``capability_not_granted`` where ``http_fetch`` is granted. Such an example still runs against the effective
policy; if it passes it counts, and if it fails it is *skipped* with a note naming the capability and where its
grant changed (never a failure of the later layer). Section examples likewise: one that holds under the
section as its layer left it, and fails only because a later layer added entries or reset the section, is
skipped with a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.guardrails.engine import ENGINE_RULES, validate
from sandforge.runtime.guardrails.policy import Policy, fingerprint
from sandforge.runtime.guardrails.results import INVALID_CODE, ValidationResult
from sandforge.runtime.guardrails.sections import SECTIONS, judge_section_example, section_examples

Expectation = Literal["trigger", "clean", "corrected", "tagged", "untagged", "allow", "deny", "accept", "refuse"]
Subject = Literal["rule", "capability", "egress", "dependencies"]
Status = Literal["passed", "failed", "skipped"]


class Example(BaseModel):
    """One example program and what it must do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: Subject
    id: str
    expectation: Expectation
    index: int
    source: str
    origin: str
    layer: int = 0
    """The layer it was written in (``Policy.layer_labels``)."""

    @property
    def name(self) -> str:
        if self.subject in SECTIONS:
            return f"{self.subject} {self.expectation}[{self.index}]"
        return f"{self.subject} {self.id} {self.expectation}[{self.index}]"


class ExampleOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    example: Example
    status: Status
    detail: str

    @property
    def passed(self) -> bool:
        """Not failed (a skipped example is no failure)."""
        return self.status != "failed"


def examples(policy: Policy) -> Iterator[Example]:
    """Every example of every enabled rule, of every capability and of the sections, in policy order."""
    for rule in policy.active_rules:
        for expectation in ("trigger", "clean", "corrected"):
            programs = getattr(rule.spec.examples, expectation)
            yield from _examples("rule", rule.id, str(rule.origin), expectation, programs, rule.examples_layer)
    for tag, definition in policy.capabilities.items():
        for expectation, programs, layers in (
            ("tagged", definition.tagged, definition.tagged_layers),
            ("untagged", definition.untagged, definition.untagged_layers),
        ):
            for index, source in enumerate(programs):
                layer = layers[index] if index < len(layers) else definition.layer
                yield Example(subject="capability", id=tag, expectation=expectation, index=index, source=source,
                              origin=str(definition.origin), layer=layer)  # fmt: skip
    for item in section_examples(policy):
        yield Example(subject=item.section, id=item.section, expectation=item.expectation, index=item.index,
                      source=item.source, origin=str(item.origin), layer=item.layer)  # fmt: skip


def _examples(
    subject: Subject, name: str, origin: str, expectation: Expectation, programs: Sequence[str], layer: int
) -> Iterator[Example]:
    for index, source in enumerate(programs):
        yield Example(subject=subject, id=name, expectation=expectation, index=index, source=source, origin=origin,
                      layer=layer)  # fmt: skip


def check_example(example: Example, policy: Policy) -> ExampleOutcome:
    """Judge one example against the effective policy; an example that does not parse always fails, one whose
    assumptions a later layer changed is skipped (see the module docstring)."""
    if example.subject in SECTIONS:
        return _check_section(example, policy)
    result = validate(example.source, policy)
    broken = next((v for v in result.violations if v.violation_type == INVALID_CODE), None)
    if broken is not None:
        return ExampleOutcome(example=example, status="failed", detail=f"example does not parse: {broken.message}")
    if example.subject == "rule":
        passed, detail = _judge_rule(example, result)
        changed = "" if passed else _changed_grants(example, policy, result)
        if changed:  # it holds under the grants it was written for, not under these: no failure of the author's
            return ExampleOutcome(example=example, status="skipped", detail=f"{changed} (would fail: {detail})")
        if not passed:
            detail += _changed_by(example, policy)
    else:
        tagged = example.id in result.capability_tags
        passed = tagged == (example.expectation == "tagged")
        found = ", ".join(result.capability_tags) or "none"
        detail = f"capabilities found: {found}"
        changed = "" if passed else _changed_detection(example, policy)
        if changed:
            return ExampleOutcome(example=example, status="skipped", detail=f"{changed} (now: {detail})")
    return ExampleOutcome(example=example, status="passed" if passed else "failed", detail=detail)


def _changed_by(example: Example, policy: Policy) -> str:
    """Who to look at when a rule's example fails after a later layer overrode or disabled the rule."""
    rule = policy.rule(example.id)
    if rule is None:
        return ""
    later = [(layer, origin) for layer, origin in zip(rule.changed_layers, rule.changed_at, strict=False)
             if layer > example.layer]  # fmt: skip
    if not later:
        return ""
    layer, origin = later[-1]
    return f"; the rule was changed by layer {policy.layer_labels[layer]} at {origin} after this example was written"


def _changed_grants(example: Example, policy: Policy, result: ValidationResult) -> str:
    """A note when the example uses a capability whose grant a layer after the example's changed; else empty."""
    if example.layer >= len(policy.layer_grants) - 1:
        return ""
    assumed = policy.layer_grants[example.layer]
    was = policy.layer_labels[example.layer] if example.layer < len(policy.layer_labels) else "its layer"
    notes = []
    for tag in result.capability_tags:
        if (tag in assumed) != (tag in policy.granted):
            then, now = ("denied", "grants") if tag in policy.granted else ("granted", "denies")
            where = policy.grant_origins.get(tag)
            notes.append(
                f"assumes {tag} {then} (as in layer {was}); a later layer {now} it{f' at {where}' if where else ''}"
            )
    return f"skipped: {'; '.join(notes)}" if notes else ""


def _changed_detection(example: Example, policy: Policy) -> str:
    """A note when a capability example holds with the matchers its layer (and earlier ones) gave the tag, and
    fails only because a later layer added matchers; else empty."""
    definition = policy.capabilities[example.id]
    keep = [i for i, layer in enumerate(definition.matcher_layers) if layer <= example.layer]
    if len(keep) == len(definition.matchers):
        return ""
    then_definition = dataclasses.replace(
        definition,
        matchers=tuple(definition.matchers[i] for i in keep),
        specs=tuple(definition.specs[i] for i in keep),
        matcher_layers=tuple(definition.matcher_layers[i] for i in keep),
    )
    then = dataclasses.replace(policy, capabilities={**policy.capabilities, example.id: then_definition})
    then = dataclasses.replace(then, fingerprint=fingerprint(then))  # results are cached by fingerprint
    tagged = example.id in validate(example.source, then).capability_tags
    if tagged != (example.expectation == "tagged"):
        return ""
    label = policy.layer_labels[example.layer] if example.layer < len(policy.layer_labels) else "its layer"
    return f"skipped: holds with the {example.id} matchers up to layer {label}; a later layer added matchers"


def _check_section(example: Example, policy: Policy) -> ExampleOutcome:
    """A section example against the effective section; one that fails only because a later layer changed the
    section (added an allow entry, reset it) is skipped with a note, like a rule example a later grant breaks."""
    passed, detail = judge_section_example(policy, example.subject, example.expectation, example.source)
    if passed:
        return ExampleOutcome(example=example, status="passed", detail=detail)
    if example.layer < len(policy.layer_sections) - 1:
        then = dataclasses.replace(policy, **policy.layer_sections[example.layer])
        held, _ = judge_section_example(then, example.subject, example.expectation, example.source)
        if held:
            label = policy.layer_labels[example.layer]
            note = f"skipped: holds under layer {label}'s {example.subject} section; a later layer changed it"
            return ExampleOutcome(example=example, status="skipped", detail=f"{note} (now: {detail})")
    return ExampleOutcome(example=example, status="failed", detail=detail)


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
