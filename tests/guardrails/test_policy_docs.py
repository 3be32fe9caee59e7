"""docs/policies.md marks the required fields of a policy file (issue 23); the table follows the models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from sandforge.runtime.egress.config import AllowEntry, Credential
from sandforge.runtime.guardrails import policy_model as pm

DOC = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text(encoding="utf-8")


def _row(where: str) -> tuple[set[str], set[str]]:
    match = re.search(rf"^\| {re.escape(where)} \|(?P<required>[^|]*)\|(?P<optional>[^|]*)\|$", DOC, re.MULTILINE)
    assert match is not None, f"no row for {where!r} in docs/policies.md"
    return set(re.findall(r"`([a-z_]+)`", match["required"])), set(re.findall(r"`([a-z_]+)`", match["optional"]))


@pytest.mark.parametrize(
    ("where", "model"),
    [
        ("a rule (`rules: [...]`)", pm.RuleSpec),
        ("a rule's `examples`", pm.RuleExamples),
        ("a capability (`capabilities: {tag: ...}`)", pm.CapabilitySpec),
        ("a capability's `examples`", pm.CapabilityExamples),
        ("an egress credential", Credential),
    ],
)
def test_required_fields_table_follows_the_models(where: str, model: type[BaseModel]) -> None:
    required, optional = _row(where)
    assert required == set(pm.required_fields(model))
    assert optional == set(model.model_fields) - required


def test_allow_entries_need_one_target() -> None:
    required, optional = _row("an egress `allow` entry")
    assert required == {"url", "host"} and not pm.required_fields(AllowEntry)  # enforced by a validator
    assert optional == set(AllowEntry.model_fields) - required


def test_a_missing_field_names_what_is_required() -> None:
    hint = pm.hint_for({"type": "missing"}, ("rules", 0, "rationale"), {"rules": [{}]})
    assert hint == "required fields here: " + ", ".join(pm.required_fields(pm.RuleSpec))
