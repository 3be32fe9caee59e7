"""Structured delegate contracts on the wire, staged declarations, deliverables checked with JSON Schema,
and the normalisation policy of depth-0 exhaustion (issue 16, points 2, 3 and 5).

Every test runs real calls through the public API on each sandbox backend (containers skip without an
engine), with a scripted provider.
"""

from __future__ import annotations

import json

import pytest

from sandforge.runtime.agent import GUARDRAIL_EXHAUSTED_MESSAGE, Agent
from sandforge.runtime.agent.contracts import InvalidContract, check_deliverable, to_json_schema
from sandforge.runtime.agent.lifecycle import NORMALIZATION_POLICY
from tests.agent.conftest import RECOVERABLE, MakeWorkspace, records, top

PAGE_PARSER = (
    "f = delegate('page_parser', purpose='Parse a page into its title',\n"
    "             deliverable={'type': 'object', 'required': ['title'], 'properties': {'title': {'type': 'string'}}},\n"
    "             acceptance=['the title is not empty', {'max_chars': 200}],\n"
    "             failure_policy={'on_error': 'retry', 'retries': 1})\n"
    "r = f.parse(args[0])\n"
    "return r.value if r.ok else r.error_type\n"
)
PARSE = "return {'title': args[0].upper()}\n"


# --- point 2: JSON contracts on the wire, the registry and the prompt --------------------------------------


def test_a_structured_contract_crosses_the_wire_and_reaches_registry_and_prompt(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([PAGE_PARSER, PARSE])
    out = Agent.for_role("researcher", workspace=ws).read("home")
    assert out.ok, out
    assert out.value == {"title": "HOME"}
    contract = ws.tools["page_parser"]
    assert contract.deliverable == {
        "type": "object", "required": ["title"], "properties": {"title": {"type": "string"}},
    }  # fmt: skip
    assert contract.acceptance == ["the title is not empty", {"max_chars": 200}]
    assert contract.failure_policy == {"on_error": "retry", "retries": 1}
    # the nested generation saw the contract, JSON values rendered as JSON
    assert provider.requests[1].contract == contract
    user = provider.prompts[1].user
    block = user.split('<untrusted_data source="contract">', 1)[1].split("</untrusted_data>", 1)[0]
    rendered = json.loads(block)  # program-originated values reach the prompt only as JSON data
    assert rendered["deliverable"]["required"] == ["title"]
    assert rendered["failure_policy"] == {"on_error": "retry", "retries": 1}
    assert all(r.error_type != "sandbox_violation" for r in records(ws))


def test_a_declared_contract_is_staged_without_a_call_and_committed_with_the_attempt(make_ws: MakeWorkspace) -> None:
    declare_only = "delegate('summarizer', purpose='Summarize a text', deliverable={'type': 'string'})\nreturn 1\n"
    ws, provider = make_ws([declare_only])
    assert Agent.for_role("planner", workspace=ws).plan().ok
    assert ws.tools["summarizer"].deliverable == {"type": "string"}
    assert provider.calls == 1  # the tool was declared, never called

    failing = "delegate('translator', purpose='Translate', deliverable={'type': 'string'})\nreturn 1 / 0\n"
    ws2, _ = make_ws([failing], execution_repair_budget=0)
    out = Agent.for_role("planner", workspace=ws2).plan()
    assert not out.ok and out.error_type == "execution"
    assert "translator" not in ws2.tools  # staged with the failed attempt, rolled back with it


def test_a_declared_tool_whose_call_failed_is_not_registered(make_ws: MakeWorkspace) -> None:
    boss = "f = delegate('broken', purpose='Always fails')\nr = f.go()\nreturn r.error_type\n"
    ws, _ = make_ws([boss, "return 1 / 0\n"], execution_repair_budget=0)
    out = Agent.for_role("boss", workspace=ws).run()
    assert out.ok and out.value == "execution"
    assert "broken" not in ws.tools


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("deliverable={1, 2}", "not JSON"),  # a set
        ("acceptance=[len]", "not JSON"),  # a function
        ("purpose=42", "purpose must be a string"),
        ("purpose='x' * 1001", "purpose is longer than 1000"),
        ("acceptance=['y' * 3000]", "longer than 2000"),
        ("deliverable={'type': 'no_such_type'}", "not a valid JSON Schema"),  # refused by the host
        ("deliverable={'type': 'string', 'pattern': '(a+)+$'}", "'pattern' is not supported"),
    ],
)
def test_a_contract_field_that_is_not_usable_is_invalid_contract_with_feedback(
    make_ws: MakeWorkspace, bad: str, needle: str
) -> None:
    wrong = f"f = delegate('helper', {bad})\nreturn f.go(1).value\n"
    right = "f = delegate('helper', purpose='Echo', deliverable={'type': 'integer'})\nreturn f.go(args[0]).value\n"
    ws, provider = make_ws([wrong, right, "return args[0]\n"])
    out = Agent.for_role("boss", workspace=ws).run(7)
    assert out.ok and out.value == 7, out
    rec = top(ws)
    failure = rec.attempt_failures[0]
    assert failure.error_type == "invalid_contract" and failure.stage == "execution"
    assert needle in failure.error_message
    feedback = provider.requests[1].feedback
    assert [(f.kind, f.error_type) for f in feedback] == [("execution", "invalid_contract")]
    assert needle in (feedback[0].error_message or "")
    assert all(r.error_type != "sandbox_violation" for r in records(ws))
    assert ws.tools["helper"].purpose == "Echo"

    ws2, _ = make_ws([wrong], execution_repair_budget=0)
    out2 = Agent.for_role("boss", workspace=ws2).run(7)
    assert out2.error_type == "invalid_contract" and not out2.retriable
    assert out2.metadata["failure_class"] == top(ws2).failure_class == "intrinsic"
    assert "helper" not in ws2.tools


# --- point 3: deliverables are checked ---------------------------------------------------------------------


def test_a_result_that_misses_the_shorthand_deliverable_is_a_contract_violation_then_repaired(
    make_ws: MakeWorkspace,
) -> None:
    ws, provider = make_ws(["context['n'] = 1\nreturn []\n", "context['n'] = 2\nreturn [args[0]]\n"])
    ws.register_tool("lister", purpose="List items", deliverable={"type": "array", "min_items": 1})
    lister = Agent.for_role("lister", workspace=ws)
    out = lister.items("a")
    assert out.ok and out.value == ["a"]
    assert lister.context == {"n": 2}
    rec = top(ws)
    failure = rec.attempt_failures[0]
    assert (failure.stage, failure.error_type, failure.failure_class) == (
        "outcome_policy",
        "contract_violation",
        "adaptive",
    )
    assert rec.outcome_repair_attempts == 1 and rec.rollback_applied
    feedback = provider.requests[1].feedback[0]
    assert feedback.kind == "outcome" and feedback.error_type == "contract_violation"
    assert feedback.failure_class == "adaptive"
    assert "at $: expected minItems 1, actual []" in (feedback.error_message or "")


def test_an_exhausted_contract_violation_is_retriable_adaptive_and_never_committed(make_ws: MakeWorkspace) -> None:
    wrong = "context['seen'] = True\nreturn {'title': 3}\n"
    ws, provider = make_ws([wrong, wrong, wrong])
    ws.register_tool(
        "titler",
        deliverable={"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
    )
    out = Agent.for_role("titler", workspace=ws).title("x")
    assert not out.ok and out.error_type == "contract_violation" and out.retriable
    assert provider.calls == 2  # default outcome-repair budget 1
    violation = out.metadata["contract_violation"]
    assert violation["path"] == "$.title" and violation["expected"] == 'type "string"' and violation["actual"] == "3"
    assert out.metadata["failure_class"] == "adaptive"
    rec = top(ws)
    assert rec.failure_class == "adaptive" and rec.outcome_repair_retry_exhausted
    assert rec.value is None and ws.context("titler") == {}


def test_a_delegated_deliverable_is_checked_for_the_nested_call(make_ws: MakeWorkspace) -> None:
    boss = (
        "f = delegate('counter', purpose='Count words', deliverable={'type': 'integer', 'minimum': 0})\n"
        "r = f.count(args[0])\nreturn [r.ok, r.value, r.error_type]\n"
    )
    ws, _ = make_ws([boss, "return str(len(args[0].split()))\n", "return len(args[0].split())\n"])
    out = Agent.for_role("boss", workspace=ws).run("a b c")
    assert out.ok and out.value == [True, 3, None]
    nested = [r for r in records(ws) if r.depth == 1][-1]
    assert [f.error_type for f in nested.attempt_failures] == ["contract_violation"]


def test_prose_deliverables_are_not_checked_and_shorthand_maps_to_json_schema() -> None:
    assert check_deliverable([], "a non-empty list of headlines") is None
    assert to_json_schema({"type": "list", "min_items": 1, "items": {"type": "str", "max_length": 3}}) == {
        "type": "array", "minItems": 1, "items": {"type": "string", "maxLength": 3},
    }  # fmt: skip
    miss = check_deliverable(
        {"items": ["abcd"]}, {"type": "dict", "properties": {"items": {"items": {"max_length": 3}}}}
    )
    assert miss is not None and miss.path == "$.items[0]" and miss.expected == "maxLength 3"
    with pytest.raises(InvalidContract):
        to_json_schema({"$ref": "https://example.com/schema.json"})


# --- point 5: the normalisation policy is named -------------------------------------------------------------


def test_depth_0_exhaustion_records_its_normalization_policy(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([RECOVERABLE] * 3)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_message == GUARDRAIL_EXHAUSTED_MESSAGE
    assert out.metadata["normalization_policy"] == NORMALIZATION_POLICY == "boundary-normalization/v1"
    assert top(ws).normalization_policy == NORMALIZATION_POLICY
    assert out.metadata["failure_class"] == top(ws).failure_class == "intrinsic"

    boss = "r = tool('inner').go()\nreturn r.error_type\n"
    ws2, _ = make_ws([boss, RECOVERABLE, RECOVERABLE, RECOVERABLE])
    assert Agent.for_role("boss", workspace=ws2).run().value == "guardrail_retry_exhausted"
    nested = [r for r in records(ws2) if r.depth == 1][-1]
    assert nested.normalization_policy is None and nested.error_message != GUARDRAIL_EXHAUSTED_MESSAGE
