"""ADR 0016 lifecycle on a real sandbox (every backend of the sandbox_backend fixture), scripted provider."""

from __future__ import annotations

import pytest

from sandforge.runtime.agent import GUARDRAIL_EXHAUSTED_MESSAGE, Agent
from sandforge.runtime.providers import InvalidProviderOutput, ProviderError
from sandforge.sandbox import Limits
from tests.agent.conftest import RECOVERABLE, RECOVERABLE_RULE, TERMINAL, MakeWorkspace, records, top

OK_ADD = "context['memory'] = context.get('memory', 0) + args[0]\nreturn context['memory']\n"
RAISES = "context['memory'] = 999\nreturn 1 / 0\n"


# --- recoverable guardrails ----------------------------------------------------------------------


def test_recoverable_violation_then_valid_program(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([RECOVERABLE, OK_ADD])
    calc = Agent.for_role("calc", workspace=ws)
    out = calc.add(3)
    assert out.ok and out.value == 3
    assert provider.calls == 2
    rec = top(ws)
    assert rec.status == "ok" and rec.attempts == 2
    assert [f.stage for f in rec.attempt_failures] == ["validation"]
    first = rec.attempt_failures[0]
    assert first.error_class == RECOVERABLE_RULE and first.attempt_number == 1
    assert first.call_id == rec.call_id and first.attempt_id == f"{rec.call_id}.1"
    assert first.timestamp is not None and first.failure_class == "recoverable"
    assert rec.guardrail_recovery_attempts == 1 and not rec.guardrail_retry_exhausted
    assert rec.validation_failure_type == RECOVERABLE_RULE
    assert rec.rollback_applied and rec.retry_feedback_injected
    assert rec.latest_failure_stage == "validation" and rec.latest_failure_class == RECOVERABLE_RULE
    assert rec.attempt_stage == "executed" and rec.verdict == "approved"
    # the rejected program never ran: its context write is nowhere
    assert calc.context == {"memory": 3}
    # structured feedback reached the second generation
    feedback = provider.requests[1].feedback
    assert len(feedback) == 1
    fb = feedback[0]
    assert fb.kind == "guardrail" and fb.violation_type == RECOVERABLE_RULE
    assert fb.violation_message and fb.required_correction
    assert fb.violation_location and fb.violation_location.startswith("line 1")
    assert (fb.attempt_number, fb.remaining_budget) == (1, 1)
    assert fb.previous_code == RECOVERABLE
    assert '"required_correction"' in provider.prompts[1].user
    assert provider.requests[0].feedback == []


def test_guardrail_exhaustion_is_typed_and_normalized_at_depth_0(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([RECOVERABLE, RECOVERABLE, RECOVERABLE, OK_ADD])
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert not out.ok
    assert out.error_type == "guardrail_retry_exhausted" and out.retriable is False
    assert out.error_message == GUARDRAIL_EXHAUSTED_MESSAGE
    assert RECOVERABLE_RULE not in (out.error_message or "")
    assert provider.calls == 3 and provider.remaining == 1  # default budget 2: three programs, no more
    last = out.metadata["last_violation"]
    assert last["violation_type"] == RECOVERABLE_RULE and last["required_correction"]
    assert RECOVERABLE_RULE in out.metadata["raw_error_message"]
    assert [f["stage"] for f in out.metadata["attempt_failures"]] == ["validation"] * 3
    rec = top(ws)
    assert rec.guardrail_retry_exhausted and rec.guardrail_recovery_attempts == 2
    assert rec.error_message == GUARDRAIL_EXHAUSTED_MESSAGE
    assert rec.attempt_stage == "rolled_back"
    assert [fb.remaining_budget for fb in provider.requests[2].feedback] == [1, 0]
    assert ws.context("calc") == {}


@pytest.mark.parametrize(("budget", "calls"), [(0, 1), (1, 2), (3, 4)])
def test_guardrail_recovery_budget_bounds_regeneration(make_ws: MakeWorkspace, budget: int, calls: int) -> None:
    ws, provider = make_ws([RECOVERABLE] * 6, guardrail_recovery_budget=budget)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "guardrail_retry_exhausted"
    assert provider.calls == calls


def test_guardrail_exhaustion_is_raw_for_a_nested_caller(make_ws: MakeWorkspace) -> None:
    parent = (
        "r = tool('helper').work()\n"
        "return {'status': r.status, 'error_type': r.error_type, 'message': r.error_message,\n"
        "        'retriable': r.retriable}\n"
    )
    ws, provider = make_ws([parent, RECOVERABLE, RECOVERABLE, RECOVERABLE])
    out = Agent.for_role("boss", workspace=ws).run()
    assert out.ok, out
    nested = out.value
    assert isinstance(nested, dict)
    assert nested["status"] == "error" and nested["error_type"] == "guardrail_retry_exhausted"
    assert nested["retriable"] is False
    assert nested["message"] != GUARDRAIL_EXHAUSTED_MESSAGE
    assert RECOVERABLE_RULE in nested["message"]
    child = [r for r in records(ws) if r.depth == 1]
    assert len(child) == 1 and child[0].guardrail_retry_exhausted
    assert child[0].error_message == nested["message"]
    assert provider.calls == 4


# --- terminal guardrails -------------------------------------------------------------------------


def test_terminal_violation_returns_at_once(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([TERMINAL, OK_ADD])
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "guardrail_violation" and out.retriable is False
    assert provider.calls == 1 and provider.remaining == 1
    assert out.metadata["violations"]
    rec = top(ws)
    assert [f.stage for f in rec.attempt_failures] == ["validation"]
    assert rec.attempt_failures[0].failure_class == "terminal"
    assert rec.guardrail_recovery_attempts == 0 and not rec.guardrail_retry_exhausted
    assert rec.verdict == "terminal"


# --- execution failures --------------------------------------------------------------------------


def test_execution_always_failing_makes_exactly_two_provider_calls(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([RAISES, RAISES, OK_ADD])
    calc = Agent.for_role("calc", workspace=ws)
    calc.memory = 1
    out = calc.add(1)
    assert out.error_type == "execution" and out.retriable is False
    assert "ZeroDivisionError" in (out.error_message or "")
    assert provider.calls == 2 and provider.remaining == 1
    assert calc.memory == 1  # both attempts wrote 999 and were rolled back
    rec = top(ws)
    assert rec.execution_repair_attempts == 1 and rec.execution_repair_exhausted
    assert [(f.stage, f.error_class) for f in rec.attempt_failures] == [("execution", "ZeroDivisionError")] * 2
    fb = provider.requests[1].feedback[0]
    assert fb.kind == "execution" and fb.error_type == "execution"
    assert fb.error_message and "ZeroDivisionError" in fb.error_message
    assert fb.previous_code == RAISES and fb.remaining_budget == 0


def test_polluted_context_is_rolled_back_before_the_retry(make_ws: MakeWorkspace) -> None:
    polluting = "context['polluted'] = True\ncontext['memory'] = 999\ncontext['items'].append('x')\nreturn {}['boom']\n"
    observing = (
        "context['memory'] = context['memory'] + 1\nreturn {'seen': sorted(context), 'items': context['items']}\n"
    )
    ws, provider = make_ws([polluting, observing])
    calc = Agent.for_role("calc", workspace=ws, context={"memory": 1, "items": []})
    out = calc.add(1)
    assert out.ok, out
    assert out.value == {"seen": ["items", "memory"], "items": []}
    assert calc.context == {"memory": 2, "items": []}
    assert provider.requests[1].context_keys == ["items", "memory"]
    assert top(ws).attempt_failures[0].error_class == "KeyError"


def test_execution_repair_budget_zero_returns_the_first_failure(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([RAISES, OK_ADD], execution_repair_budget=0)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "execution" and provider.calls == 1


def test_repaired_call_keeps_first_attempt_diagnostics(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([RAISES, OK_ADD])
    out = Agent.for_role("calc", workspace=ws).add(2)
    assert out.ok and out.value == 2
    failures = out.metadata["attempt_failures"]
    assert failures[0]["stage"] == "execution" and failures[0]["error_class"] == "ZeroDivisionError"
    assert failures[0]["timestamp"]
    rec = top(ws)
    assert rec.latest_failure_stage == "execution" and "division" in (rec.latest_failure_message or "")
    assert rec.execution_repair_attempts == 1 and not rec.execution_repair_exhausted


# --- retriable outcomes --------------------------------------------------------------------------


def test_adaptive_retriable_outcome_is_repaired(make_ws: MakeWorkspace) -> None:
    bad = "context['memory'] = 5\nreturn Outcome.error('parse_error', 'could not parse the input', retriable=True)\n"
    ws, provider = make_ws([bad, OK_ADD])
    calc = Agent.for_role("calc", workspace=ws)
    out = calc.add(4)
    assert out.ok and out.value == 4
    assert calc.context == {"memory": 4}
    rec = top(ws)
    assert rec.outcome_repair_attempts == 1 and rec.outcome_repair_triggered
    assert not rec.outcome_repair_retry_exhausted
    failure = rec.attempt_failures[0]
    assert (failure.stage, failure.error_class, failure.failure_class) == ("outcome_policy", "parse_error", "adaptive")
    fb = provider.requests[1].feedback[0]
    assert fb.kind == "outcome" and fb.error_type == "parse_error" and fb.failure_class == "adaptive"


def test_swallowed_exception_outcome_is_repaired_then_exhausted(make_ws: MakeWorkspace) -> None:
    swallowing = (
        "try:\n    value = 1 / 0\nexcept ZeroDivisionError as exc:\n"
        "    return Outcome.error('internal_bug', str(exc), retriable=True)\nreturn value\n"
    )
    ws, provider = make_ws([swallowing, swallowing, OK_ADD])
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "outcome_repair_retry_exhausted" and out.retriable is False
    assert provider.calls == 2 and provider.remaining == 1
    assert out.metadata["last_outcome"]["error_type"] == "internal_bug"
    assert out.metadata["last_outcome"]["failure_class"] == "intrinsic"
    rec = top(ws)
    assert rec.outcome_repair_retry_exhausted and rec.outcome_repair_attempts == 1
    assert [f.stage for f in rec.attempt_failures] == ["outcome_policy", "outcome_policy"]


def test_outcome_repair_budget_is_configurable(make_ws: MakeWorkspace) -> None:
    bad = "return Outcome.error('wrong_answer', 'no', retriable=True)\n"
    ws, provider = make_ws([bad] * 5, fresh_outcome_repair_budget=3)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "outcome_repair_retry_exhausted"
    assert provider.calls == 4


def test_a_program_reported_timeout_is_at_most_adaptive_and_is_repaired(make_ws: MakeWorkspace) -> None:
    # Only what the host observed is extrinsic: a program saying "timeout" is making a claim (issue 13).
    slow = "context['memory'] = 1\nreturn Outcome.error('timeout', 'the upstream service timed out', retriable=True)\n"
    ws, provider = make_ws([slow, OK_ADD])
    calc = Agent.for_role("calc", workspace=ws)
    out = calc.add(1)
    assert out.ok and provider.calls == 2
    rec = top(ws)
    assert rec.outcome_repair_attempts == 1 and rec.outcome_repair_triggered
    assert rec.attempt_failures[0].error_type == "timeout"
    assert rec.attempt_failures[0].failure_class == "adaptive"


def test_a_program_reported_timeout_that_persists_is_adaptive_not_extrinsic(make_ws: MakeWorkspace) -> None:
    slow = "return Outcome.error('timeout', 'the upstream service timed out', retriable=True)\n"
    ws, provider = make_ws([slow] * 3)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "outcome_repair_retry_exhausted" and provider.calls == 2
    assert top(ws).failure_class == "adaptive"


def test_sandbox_timeout_passes_through_without_regeneration(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws(["while True:\n    pass\n", OK_ADD], limits=Limits(timeout_s=0.5))
    out = Agent.for_role("calc", workspace=ws).spin()
    assert out.error_type == "timeout" and out.retriable is True
    assert provider.calls == 1


def test_non_retriable_tool_error_is_the_answer(make_ws: MakeWorkspace) -> None:
    program = "return Outcome.error('division_by_zero', 'cannot divide by zero', retriable=False)\n"
    ws, provider = make_ws([program, OK_ADD])
    out = Agent.for_role("calc", workspace=ws).divide(0)
    assert (out.status, out.error_type, out.error_message, out.retriable) == (
        "error", "division_by_zero", "cannot divide by zero", False,
    )  # fmt: skip
    assert provider.calls == 1 and top(ws).attempt_failures == []


# --- generation retries --------------------------------------------------------------------------


def test_invalid_provider_output_uses_the_generation_budget_only(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws(
        ["def broken(:\n", InvalidProviderOutput("no tool call"), RECOVERABLE, OK_ADD],
        generation_retry_budget=2, guardrail_recovery_budget=1,
    )  # fmt: skip
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.ok, out
    rec = top(ws)
    assert rec.generation_retry_attempts == 2 and rec.guardrail_recovery_attempts == 1
    assert [f.stage for f in rec.attempt_failures] == ["generation", "generation", "validation"]
    assert provider.requests[1].feedback[0].kind == "generation"


def test_generation_budget_exhaustion(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws(["return (", "", OK_ADD], generation_retry_budget=1)
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "generation_retry_exhausted" and out.retriable is False
    assert provider.calls == 2
    assert top(ws).generation_retry_exhausted


def test_provider_api_error_is_typed_and_not_regenerated(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([ProviderError("the API is overloaded", retriable=True, kind="server_error"), OK_ADD])
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "provider" and out.retriable is True
    assert out.metadata["provider_error_kind"] == "server_error"
    assert provider.calls == 1


def test_empty_script_is_a_non_retriable_provider_error(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([])
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.error_type == "provider" and out.retriable is False


# --- nested calls and transactions ---------------------------------------------------------------

DELEGATING = (
    "helper = delegate('helper', purpose='counts pings', deliverable='pong')\n"
    "r = helper.ping(7)\n"
    "context['helper_said'] = r.value\n"
    "return r.value\n"
)
HELPER = "context['pings'] = context.get('pings', 0) + 1\nreturn 'pong' + str(args[0])\n"


def test_delegate_registers_a_tool_and_runs_a_nested_call(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([DELEGATING, HELPER])
    out = Agent.for_role("boss", workspace=ws).go()
    assert out.ok and out.value == "pong7"
    assert ws.tools["helper"].purpose == "counts pings" and ws.tools["helper"].deliverable == "pong"
    assert ws.context("helper") == {"pings": 1}
    assert ws.context("boss") == {"helper_said": "pong7"}
    nested_request = provider.requests[1]
    assert (nested_request.role, nested_request.method, nested_request.args, nested_request.depth) == (
        "helper", "ping", [7], 1,
    )  # fmt: skip
    assert nested_request.contract is not None and nested_request.contract.purpose == "counts pings"
    child, parent = records(ws)
    assert (child.depth, child.parent_call_id, child.trace_id) == (1, parent.call_id, parent.trace_id)
    assert parent.nested_calls == 1 and parent.depth == 0


def test_failed_attempt_leaves_no_context_and_no_registered_tool(make_ws: MakeWorkspace) -> None:
    failing = DELEGATING.replace("return r.value", "return r.value + 1")  # str + int: TypeError after the writes
    observing = "return {'keys': sorted(context), 'known': 0}\n"
    ws, provider = make_ws([failing, HELPER, observing])
    boss = Agent.for_role("boss", workspace=ws, context={"start": True})
    out = boss.go()
    assert out.ok, out
    assert out.value == {"keys": ["start"], "known": 0}
    # neither the context write, the registration nor the nested call's own context survived
    assert boss.context == {"start": True}
    assert "helper" not in ws.tools
    assert ws.context("helper") == {}
    retry = provider.requests[2]
    assert retry.context_keys == ["start"]
    assert [t.role for t in retry.known_tools] == []
    # the nested call's record went with its attempt; the failure entry says what was discarded
    assert [r.role for r in records(ws)] == ["boss"]
    discarded = top(ws).attempt_failures[0].discarded_nested_calls
    assert [(d.role, d.method, d.status) for d in discarded] == [("helper", "ping", "ok")]


def test_nested_failure_is_a_value_the_program_can_inspect(make_ws: MakeWorkspace) -> None:
    parent = (
        "r = tool('helper').div(1, 0)\n"
        "if not r.ok:\n    return {'caught': r.error_type, 'retriable': r.retriable}\n"
        "return r.value\n"
    )
    child = (
        "if args[1] == 0:\n    return Outcome.error('division_by_zero', 'no', retriable=False)\n"
        "return args[0] / args[1]\n"
    )
    ws, _ = make_ws([parent, child])
    out = Agent.for_role("boss", workspace=ws).run()
    assert out.ok and out.value == {"caught": "division_by_zero", "retriable": False}


def test_max_depth_bounds_recursion(make_ws: MakeWorkspace) -> None:
    recursive = "r = tool('loop').again()\nreturn {'status': r.status, 'error_type': r.error_type, 'inner': r.value}\n"
    ws, provider = make_ws([recursive] * 5, max_depth=1)
    out = Agent.for_role("loop", workspace=ws).again()
    assert out.ok
    assert out.value == {"status": "ok", "error_type": None,
                         "inner": {"status": "error", "error_type": "max_depth_exceeded", "inner": None}}  # fmt: skip
    assert provider.calls == 2


def test_state_is_kept_across_calls(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([OK_ADD, OK_ADD, OK_ADD])
    calc = Agent.for_role("calc", workspace=ws)
    assert [calc.add(n).value for n in (1, 2, 3)] == [1, 3, 6]
    assert calc.memory == 6
    assert provider.calls == 3
    assert provider.requests[2].context_summary == {"memory": "int = 3"}


def test_agent_for_role_runs_on_the_backend(sandbox_backend: str, tmp_path: object) -> None:
    from sandforge.runtime.providers import ScriptedProvider

    provider = ScriptedProvider([OK_ADD])
    with Agent.for_role("calc", provider=provider, sandbox=sandbox_backend, log=False,  # type: ignore[arg-type]
                        context={"memory": 10}) as calc:  # fmt: skip
        out = calc.add(5)
        assert out.ok and out.value == 15
        assert out.metadata["backend"] == sandbox_backend
        assert calc.workspace.log.records[0].backend == sandbox_backend
