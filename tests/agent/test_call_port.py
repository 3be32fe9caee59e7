"""The call loop on its port alone: a hand-made CallEnv (no Workspace) over the in-memory sandbox.

Fast unit tests of the wiring (the policy decides before the sandbox sees anything, the record goes to
the sink, nested calls run on the same environment); the lanes' behaviour on real sandboxes is
test_lifecycle.py's.
"""

from __future__ import annotations

import dataclasses

import pytest

from sandforge.runtime.agent import Budgets, CallRecord, Outcome
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.lifecycle import CallRun
from sandforge.runtime.agent.state import StagedRecord, State
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.gate import Approval, NotApproved, approve, execute_approved
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import BridgeHandler, BridgeReply, ExecutionOutcome, ExecutionRequest, Limits
from sandforge.sandbox.protocol import CallFrame, CallTarget
from tests.agent.conftest import RECOVERABLE
from tests.agent.memory_sandbox import MemorySandbox, context_of, raises, returns


@dataclasses.dataclass
class Harness:
    env: CallEnv
    sandbox: MemorySandbox
    provider: ScriptedProvider
    sink: list[StagedRecord]

    def call(self, role: str, method: str, *args: int) -> tuple[Outcome, CallRecord]:
        outcome = CallRun.top(self.env, CallSpec(role=role, method=method, args=list(args), kwargs={})).run()
        return outcome, self.sink[-1].record


def harness(programs: list[str], sandbox: MemorySandbox, **budgets: int) -> Harness:
    provider = ScriptedProvider(programs)
    sink: list[StagedRecord] = []
    state = State(sink.extend)
    env = CallEnv(
        provider=provider, provider_name="scripted", policy=default_policy(), sandbox=sandbox, backend=None,
        limits=Limits(), budgets=Budgets(**budgets), trace_budget=TraceBudget(), store=None, state=state,
        records=sink.extend,
    )  # fmt: skip
    return Harness(env, sandbox, provider, sink)


def test_the_environment_is_immutable() -> None:
    h = harness([], MemorySandbox({}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.env.policy = default_policy()  # type: ignore[misc]
    run = CallRun.top(h.env, CallSpec(role="r", method="m", args=[], kwargs={}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.lanes = run.lanes  # type: ignore[misc]


def test_a_call_commits_context_and_hands_its_record_to_the_sink() -> None:
    sandbox = MemorySandbox({"context['m'] = args[0]\nreturn args[0]": returns(3, m=3)})
    h = harness(["context['m'] = args[0]\nreturn args[0]"], sandbox)
    outcome, record = h.call("calc", "add", 3)
    assert outcome.ok and outcome.value == 3
    assert h.env.state.contexts["calc"].to_dict() == {"m": 3}
    assert (record.role, record.method, record.status, record.attempt_stage, record.backend) == (
        "calc", "add", "ok", "executed", "memory",
    )  # fmt: skip
    assert (record.provider, record.provider_calls, record.verdict) == ("scripted", 1, "approved")
    assert [r.args for r in sandbox.requests] == [[3]]


def test_a_refused_program_never_reaches_the_sandbox() -> None:
    fixed = "return 1"
    sandbox = MemorySandbox({fixed: returns(1)})
    h = harness([RECOVERABLE, fixed], sandbox)
    outcome, record = h.call("calc", "add")
    assert outcome.ok
    assert sandbox.ran() == [fixed]
    assert (record.guardrail_recovery_attempts, record.attempts) == (1, 2)
    assert [f.stage for f in record.attempt_failures] == ["validation"]


def test_an_execution_failure_spends_the_execution_lane() -> None:
    broken, fixed = "return 1 // 0", "return 1"
    sandbox = MemorySandbox({broken: raises("ZeroDivisionError", "integer division by zero"), fixed: returns(1)})
    h = harness([broken, fixed], sandbox, execution_repair_budget=1)
    outcome, record = h.call("calc", "div")
    assert outcome.ok and sandbox.ran() == [broken, fixed]
    assert (record.execution_repair_attempts, record.rollback_applied) == (1, True)
    assert h.provider.requests[1].feedback[0].kind == "execution"
    assert h.provider.requests[1].feedback[0].previous_code == broken


def test_a_nested_call_runs_on_the_same_environment_and_commits_with_its_parent() -> None:
    boss, helper = "return tool('helper').twice(2)", "return args[0] * 2"

    def run_boss(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        assert bridge is not None
        frame = CallFrame(type="call", id=1, target=CallTarget(kind="tool", name="helper"), method="twice", args=[2])
        reply = BridgeReply.of(bridge(frame))  # a handler answers a BridgeReply or a mapping of its fields
        return ExecutionOutcome(status="ok", value=reply.value, context=context_of(request), backend="memory")

    sandbox = MemorySandbox({boss: run_boss, helper: returns(4)})
    h = harness([boss, helper], sandbox)
    outcome, record = h.call("boss", "run")
    assert outcome.ok and outcome.value == 4
    nested, top = (s.record for s in h.sink)
    assert (nested.role, nested.depth, nested.parent_call_id, nested.trace_id) == (
        "helper", 1, top.call_id, top.trace_id,
    )  # fmt: skip
    assert top is record and top.nested_calls == 1


def test_a_sandbox_that_raises_is_sandbox_unavailable() -> None:
    def explode(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        raise OSError("no such backend")

    h = harness(["return 1"], MemorySandbox({"return 1": explode}))
    outcome, record = h.call("calc", "add")
    assert outcome.error_type == "sandbox_unavailable"
    assert "OSError: no such backend" in (record.error_message or "")


def test_the_gate_runs_only_the_approved_code() -> None:
    sandbox = MemorySandbox({"return 1": returns(1), "return 2": returns(2)})
    result, approval = approve("return 1", default_policy())
    assert result.verdict == "approved" and isinstance(approval, Approval)
    assert execute_approved(sandbox, ExecutionRequest(code="return 1"), approval).value == 1
    with pytest.raises(NotApproved):
        execute_approved(sandbox, ExecutionRequest(code="return 2"), approval)
    assert approve(RECOVERABLE, default_policy())[1] is None
    assert sandbox.ran() == ["return 1"]
