"""The published JSON Schema of policy files is generated from the pydantic models and committed."""

from __future__ import annotations

import json
from importlib.resources import files

import yaml

from sandforge.runtime.guardrails import default_policy_dir, policy_json_schema
from sandforge.runtime.guardrails.policy_model import PolicyFile


def test_committed_schema_is_the_generated_schema() -> None:
    committed = json.loads((files("sandforge.policies") / "policy.schema.json").read_text(encoding="utf-8"))
    assert committed == policy_json_schema(), (
        "policies/policy.schema.json is stale: run `sandforge policy schema > policies/policy.schema.json`"
    )


def test_schema_covers_every_section_and_matcher_kind() -> None:
    schema = policy_json_schema()
    assert set(schema["properties"]) == set(PolicyFile.model_fields) - {"schema_"} | {"$schema"}
    rule_match = schema["$defs"]["RuleSpec"]["properties"]["match"]
    assert set(rule_match["discriminator"]["mapping"]) == {
        "import",
        "name",
        "attribute",
        "call",
        "dynamic",
        "decorator",
        "definition",
        "ungranted_capability",
        "plugin",
    }


def test_default_policy_files_point_editors_at_the_schema() -> None:
    stack = [default_policy_dir()]
    seen = 0
    while stack:
        for entry in stack.pop().iterdir():
            if entry.is_dir():
                stack.append(entry)
            elif entry.name.endswith(".yaml"):
                text = entry.read_text(encoding="utf-8")
                assert text.startswith("# yaml-language-server: $schema="), entry.name
                PolicyFile.model_validate(yaml.safe_load(text))
                seen += 1
    assert seen >= 5
