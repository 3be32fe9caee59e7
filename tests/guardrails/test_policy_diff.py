"""`sandforge policy diff OLD NEW` (issue 23): what changes between two effective policies, and an exit code
that says whether anything became more permissive (a change that cannot be ordered counts: fail closed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from sandforge.runtime.guardrails import layered_policy
from sandforge.runtime.guardrails.diff import Change, diff_policies, loosens

ACME = Path(__file__).resolve().parents[2] / "policies" / "examples" / "acme"
RULE = """\
rules:
  - id: no_random
    description: Imports of random.
    rationale: For the test.
    message: "{construct} is refused"
    required_correction: Do not use {construct}.
    match: {kind: import, modules: [random]}
    examples: {trigger: [import random], clean: [import math]}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["policy", "diff", *args])


def changes(tmp_path: Path, old: str, new: str) -> list[Change]:
    return diff_policies(layered_policy([write(tmp_path, "old", old)]), layered_policy([write(tmp_path, "new", new)]))


def test_the_example_deployment_is_more_permissive(tmp_path: Path) -> None:
    base = write(tmp_path, "base", "policy: {name: base}\n")
    result = run(str(base), str(ACME), "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["more_permissive"] is True
    found = {(c["area"], c["subject"], c["effect"]) for c in data["changes"] if c["area"] != "program"}
    assert found == {
        ("rule", "dynamic_evaluation", "neutral"),
        ("rule", "no_random", "restrictive"),
        ("grant", "http_fetch", "permissive"),
        ("egress", "allow", "permissive"),
        ("dependencies", "allow", "permissive"),
    }
    evidence = {(c["subject"], c["effect"]) for c in data["changes"] if c["area"] == "program"}
    assert ("rule module_not_allowed trigger[0]", "permissive") in evidence  # `import requests` now approved
    assert ("capability http_fetch tagged[0]", "permissive") in evidence
    assert ("rule no_random trigger[0]", "restrictive") in evidence  # `import random` now refused
    text = run(str(base), str(ACME)).output
    assert "PERMISSIVE   grant         http_fetch: granted" in text and "MORE PERMISSIVE" in text


def test_only_stricter_changes_exit_zero(tmp_path: Path) -> None:
    old = write(tmp_path, "old", "grant: [http_fetch]\ndependencies: {allow: [lxml]}\n")
    new = write(tmp_path, "new", RULE + "dependencies: {block: [pandas]}\n")
    result = run(str(old), str(new))
    assert result.exit_code == 0, result.output
    assert "not more permissive" in result.output
    assert "http_fetch: no longer granted" in result.output and "allow: - pandas" in result.output


def test_identical_policies_have_no_changes(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a", "policy: {name: a}\n"), write(tmp_path, "b", "policy: {name: b}\n")
    result = run(str(a), str(b))
    assert result.exit_code == 0 and "0 change(s): no changes" in result.output


def test_rules_removed_and_disabled_are_permissive(tmp_path: Path) -> None:
    found = changes(tmp_path, RULE, "disable: [forbidden_module]\n")
    assert Change("rule", "no_random", "removed", "permissive") in found
    assert Change("rule", "forbidden_module", "disabled", "permissive") in found


@pytest.mark.parametrize(
    ("match", "effect", "detail"),
    [
        ("{kind: import, modules: [random, zlib]}", "restrictive", "modules +zlib"),
        ("{kind: import, modules: [rand*]}", "permissive", "modules -random"),
        ("{kind: import, modules: [random], except: [random.x]}", "permissive", "except +random.x"),
        ("{kind: name, names: [random]}", "unknown", "kind import -> name"),
    ],
)
def test_matcher_changes_are_ordered_when_they_can_be(tmp_path: Path, match: str, effect: str, detail: str) -> None:
    new = RULE.replace("{kind: import, modules: [random]}", match)
    found = [c for c in changes(tmp_path, RULE, new) if c.area == "rule"]
    assert len(found) == 1 and found[0].effect == effect and detail in found[0].what, found
    assert loosens(found) is (effect in ("permissive", "unknown"))


def test_reclassification_and_wording_are_neutral(tmp_path: Path) -> None:
    new = (
        RULE.replace('"{construct} is refused"', '"{construct} is not allowed"')
        + "override:\n  no_random: {classification: terminal}\n"
    )
    found = changes(tmp_path, RULE, new)
    assert {c.effect for c in found} == {"neutral"} and not loosens(found)


def test_limits_and_egress_changes(tmp_path: Path) -> None:
    old = "egress:\n  allow: [{host: a.example}]\n  limits: {max_requests: 5}\n"
    new = (
        "egress:\n  allow: [{host: b.example}]\n  allow_ranges: [10.0.0.0/8]\n  limits: {max_requests: 50}\n"
        "  credentials: [{host: b.example, header: X-Key, value: '${KEY}'}]\n"
        "limits: {max_source_bytes: 500000}\n"
    )
    found = {(c.area, c.subject, c.what, c.effect) for c in changes(tmp_path, old, new)}
    assert ("egress", "allow", "+ host b.example", "permissive") in found
    assert ("egress", "allow", "- host a.example", "restrictive") in found
    assert ("egress", "allow_ranges", "+ 10.0.0.0/8 (exempt from the platform deny list)", "permissive") in found
    assert ("egress", "limits.max_requests", "5 -> 50", "permissive") in found
    assert ("egress", "credentials", "+ x-key sent to b.example", "permissive") in found
    assert ("limits", "max_source_bytes", "262144 -> 500000", "permissive") in found


def test_a_policy_that_does_not_load_is_exit_2(tmp_path: Path) -> None:
    good = write(tmp_path, "good", "policy: {name: good}\n")
    bad = write(tmp_path, "bad", "grant: [teleport]\n")
    result = run(str(good), str(bad))
    assert result.exit_code == 2 and "unknown capability 'teleport'" in result.output


def test_program_evidence_alone_can_show_a_loosening(tmp_path: Path) -> None:
    # a matcher change the diff cannot order is backed by the programs it lets through
    new = RULE.replace("{kind: import, modules: [random]}", "{kind: name, names: [random.choice]}")
    found = changes(tmp_path, RULE, new)
    loosened = Change("program", "rule no_random trigger[0]", "recoverable -> approved: import random", "permissive")
    assert loosened in found
