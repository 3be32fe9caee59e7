"""Human and machine renderings of validation results and rules: text with source excerpts, SARIF 2.1.0,
and the ``policy explain`` page."""

from __future__ import annotations

import difflib
import textwrap
from typing import Any

from sandforge.runtime.guardrails.engine import ENGINE_RULES
from sandforge.runtime.guardrails.policy import ENGINE_VERSION, Policy, Rule
from sandforge.runtime.guardrails.results import ValidationResult, Violation
from sandforge.runtime.guardrails.sections import SECTIONS

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_NAME = "sandforge-guardrails"


# -------------------------------------------------------------------------------------------- text


def render_text(result: ValidationResult, name: str) -> str:
    """Violations ruff-style, with the offending line and a caret span, then capabilities and verdict."""
    blocks = [_violation_text(v, name) for v in result.violations]
    if result.truncated:
        blocks.append(f"{name}: more violations not shown (limits.max_violations)")
    if result.capabilities:
        described = []
        for capability in result.capabilities:
            first = capability.evidence[0] if capability.evidence else None
            where = f"line {first.line}: {first.construct}" if first else ""
            status = "" if capability.granted else "NOT GRANTED; "
            described.append(f"  {capability.tag} ({status}{where})")
        blocks.append(f"{name}: capabilities\n" + "\n".join(described))
    counts = {c: sum(v.classification == c for v in result.violations) for c in ("terminal", "recoverable")}
    summary = ", ".join(f"{n} {c}" for c, n in counts.items() if n) or "no violations"
    blocks.append(
        f"{name}: {result.verdict} ({summary}) under policy {result.policy_name} {result.policy_fingerprint[:19]}"
    )
    return "\n\n".join(blocks)


def _violation_text(violation: Violation, name: str) -> str:
    location = violation.location
    head = f"{name}:{location.line}:{location.column}" if location else name
    lines = [f"{head}: {violation.violation_type} [{violation.classification}] {violation.message}"]
    if location is not None and location.source_line:
        gutter = " " * len(str(location.line))
        end = location.end_column if location.end_line == location.line and location.end_column else None
        width = max((end or len(location.source_line) + 1) - location.column, 1)
        lines += [
            f"{gutter} |",
            f"{location.line} | {location.source_line}",
            f"{gutter} | {' ' * (location.column - 1)}{'^' * width}",
        ]
    lines.append(f"  = fix: {violation.required_correction}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- SARIF


def render_sarif(result: ValidationResult, uri: str, policy: Policy) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run; columns are code points, classification is in properties."""
    rule_ids = list(dict.fromkeys(v.violation_type for v in result.violations))
    rules = [_sarif_rule(rule_id, policy) for rule_id in rule_ids]
    results = []
    for violation in result.violations:
        entry: dict[str, Any] = {
            "ruleId": violation.violation_type,
            "ruleIndex": rule_ids.index(violation.violation_type),
            "level": "error",
            "message": {"text": violation.message},
            "properties": {
                "classification": violation.classification,
                "required_correction": violation.required_correction,
            },
        }
        location = violation.location
        region: dict[str, Any] = {}
        if location is not None:
            region = {"startLine": location.line, "startColumn": location.column}
            if location.end_line is not None:
                region["endLine"] = location.end_line
            if location.end_column is not None:
                region["endColumn"] = location.end_column
            if location.source_line:
                region["snippet"] = {"text": location.source_line}
        physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
        if region:
            physical["region"] = region
        entry["locations"] = [{"physicalLocation": physical}]
        results.append(entry)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": TOOL_NAME, "version": ENGINE_VERSION, "rules": rules}},
                "columnKind": "unicodeCodePoints",
                "results": results,
                "properties": {
                    "verdict": result.verdict,
                    "policy": result.policy_name,
                    "policy_fingerprint": result.policy_fingerprint,
                    "capabilities": [c.model_dump(mode="json") for c in result.capabilities],
                },
            }
        ],
    }


def _sarif_rule(rule_id: str, policy: Policy) -> dict[str, Any]:
    rule = policy.rule(rule_id)
    if rule is not None:
        short, full, fix, classification = (
            rule.spec.description,
            rule.spec.rationale,
            rule.spec.required_correction,
            rule.classification,
        )
    else:
        classification, short, fix = ENGINE_RULES.get(rule_id, ("terminal", rule_id, ""))
        full = short
    return {
        "id": rule_id,
        "shortDescription": {"text": short},
        "fullDescription": {"text": full},
        "help": {"text": fix},
        "defaultConfiguration": {"level": "error"},
        "properties": {"classification": classification},
    }


# ----------------------------------------------------------------------------------------- explain


def known_ids(policy: Policy) -> list[str]:
    return [rule.id for rule in policy.rules] + list(policy.capabilities) + list(ENGINE_RULES) + list(SECTIONS)


def suggestions(policy: Policy, name: str) -> list[str]:
    return difflib.get_close_matches(name, known_ids(policy), n=3, cutoff=0.5)


def explain(policy: Policy, name: str) -> str | None:
    """The documentation page of a rule, a capability tag or an engine violation type; None if unknown."""
    rule = policy.rule(name)
    if rule is not None:
        return _explain_rule(rule, policy)
    if name in policy.capabilities:
        return _explain_capability(policy, name)
    if name in ENGINE_RULES:
        classification, what, fix = ENGINE_RULES[name]
        return "\n".join(
            [
                f"# {name} ({classification})",
                "",
                "Reported by the guardrail engine itself; it cannot be disabled.",
                "",
                "## What it means",
                _wrap(what),
                "",
                "## How to fix it",
                _wrap(fix),
            ]
        )
    return None


def _explain_rule(rule: Rule, policy: Policy) -> str:
    spec = rule.spec
    status = "" if rule.enabled else " - DISABLED in this policy"
    lines = [f"# {rule.id} ({rule.classification}){status}", "", f"Defined at {rule.origin}."]
    if rule.changed_at:
        lines.append("Changed at " + ", ".join(str(o) for o in rule.changed_at) + ".")
    lines += ["", "## What it does", _wrap(spec.description)]
    plugin = getattr(rule.matcher, "plugin", None)
    if plugin is None:
        lines += ["", f"Matches {rule.matcher.describe().rstrip('.')}."]
    else:
        lines += ["", f"Checked by the Python plugin `{plugin.name}`:", "", _wrap(plugin.documentation)]
    lines += [
        "",
        "## Why is this bad?",
        _wrap(spec.rationale),
        "",
        "## Example",
        _code(spec.examples.trigger[0]),
        "",
        "## Use instead",
        _wrap(rule.correction.text),
        "",
        _code((spec.examples.corrected or spec.examples.clean)[0]),
        "",
        "## Message",
        _wrap(rule.message.text),
    ]
    return "\n".join(lines)


def _explain_capability(policy: Policy, tag: str) -> str:
    definition = policy.capabilities[tag]
    granted = "granted" if tag in policy.granted else "NOT granted (using it is a terminal violation)"
    lines = [
        f"# capability {tag} - {granted}",
        "",
        f"Defined at {definition.origin}.",
        "",
        "## What it is",
        _wrap(definition.description),
        "",
        "## Detected by",
        *(f"- {matcher.describe()}" for matcher in definition.matchers),
    ]
    if definition.tagged:
        lines += ["", "## Example", _code(definition.tagged[0])]
    return "\n".join(lines)


def _wrap(text: str) -> str:
    return "\n\n".join(textwrap.fill(paragraph, width=100) for paragraph in text.strip().split("\n\n"))


def _code(source: str) -> str:
    return "```python\n" + source.rstrip("\n") + "\n```"
