"""The default policy's own examples, run as part of the test suite (``sandforge policy test`` runs the
same examples for any policy)."""

from __future__ import annotations

import pytest

from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.guardrails.selftest import Example, check_example, examples

EXAMPLES = list(examples(default_policy()))


def test_every_rule_and_capability_ships_examples() -> None:
    policy = default_policy()
    covered = {(e.subject, e.id, e.expectation) for e in EXAMPLES}
    for rule in policy.active_rules:
        assert {("rule", rule.id, "trigger"), ("rule", rule.id, "clean")} <= covered, rule.id
    for tag in policy.capabilities:
        assert {("capability", tag, "tagged"), ("capability", tag, "untagged")} <= covered, tag


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name.replace(" ", ":") for e in EXAMPLES])
def test_example(example: Example) -> None:
    outcome = check_example(example, default_policy())
    assert outcome.passed, f"{example.origin}: {outcome.detail}\n{example.source}"
