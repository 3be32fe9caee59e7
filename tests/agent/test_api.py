"""The Agent API surface: context attributes without model calls, dynamic methods, budgets, the store seam."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent import Agent, CallRecord, Outcome, ProgramCandidate, Workspace
from sandforge.runtime.providers import GenerationRequest, ScriptedProvider
from sandforge.sandbox import ErrorType, ExecutionOutcome, SandboxConfig
from tests.agent.conftest import RECOVERABLE, RECOVERABLE_RULE

OK_ADD = "context['memory'] = context.get('memory', 0) + args[0]\nreturn context['memory']\n"


@pytest.fixture
def calc(tmp_path: Path) -> Iterator[Agent]:
    provider = ScriptedProvider([OK_ADD, OK_ADD])
    with Agent.for_role("calc", provider=provider, sandbox=SandboxConfig(pool_size=0), log=tmp_path / "c.jsonl") as a:
        yield a


def provider_of(agent: Agent) -> ScriptedProvider:
    p = agent.workspace.provider
    assert isinstance(p, ScriptedProvider)
    return p


def test_attribute_assignment_and_read_need_no_model(calc: Agent) -> None:
    calc.memory = 5
    calc.tags = ["a", {"b": 1}]
    assert calc.memory == 5 and calc.tags == ["a", {"b": 1}]
    assert calc.context == {"memory": 5, "tags": ["a", {"b": 1}]}
    assert provider_of(calc).calls == 0
    # reads are copies: mutating one does not change the committed context
    calc.tags.append("c")
    assert calc.tags == ["a", {"b": 1}]
    del calc.tags
    assert "tags" not in calc.context
    with pytest.raises(AttributeError):
        del calc.tags


def test_unknown_attribute_is_a_dynamic_method(calc: Agent) -> None:
    calc.memory = 5
    method = calc.add
    assert callable(method) and "calc.add" in repr(method)
    assert provider_of(calc).calls == 0
    out = method(2)
    assert isinstance(out, Outcome) and out.ok and out.value == 7
    assert (out.tool_role, out.method_name) == ("calc", "add")
    assert calc.memory == 7
    assert calc.call("add", 1).value == 8  # explicit form
    assert provider_of(calc).calls == 2


def test_reserved_and_private_names(calc: Agent) -> None:
    assert calc.role == "calc"
    assert isinstance(calc.workspace, Workspace)
    for name in ("role", "context", "workspace", "call", "_secret"):
        with pytest.raises(AttributeError):
            setattr(calc, name, 1)
    with pytest.raises(AttributeError):
        _ = calc._private


def test_context_values_must_be_json(calc: Agent) -> None:
    with pytest.raises(TypeError):
        calc.fn = lambda: 1
    with pytest.raises(TypeError):
        calc.bad = float("nan")
    with pytest.raises(TypeError):
        calc.add(object())
    assert provider_of(calc).calls == 0


def test_budgets_are_validated() -> None:
    provider = ScriptedProvider([])
    with pytest.raises(TypeError, match="no_such_budget"):
        Agent.for_role("x", provider=provider, log=False, no_such_budget=1)
    with pytest.raises(TypeError, match="guardrail_recovery_budget"):
        Agent.for_role("x", provider=provider, log=False, guardrail_recovery_budget=-1)
    with pytest.raises(TypeError, match="provider"):
        Agent.for_role("x")
    with pytest.raises(TypeError):
        Agent()


def test_agents_of_one_workspace_share_state(tmp_path: Path) -> None:
    ws = Workspace(provider=ScriptedProvider([]), sandbox=SandboxConfig(pool_size=0), log=False)
    a = Agent.for_role("calc", workspace=ws, context={"memory": 1})
    b = Agent.for_role("calc", workspace=ws)
    assert b.memory == 1
    b.memory = 2
    assert a.memory == 2
    with pytest.raises(TypeError):
        Agent.for_role("calc", workspace=ws, max_depth=2)
    ws.close()


class _FakeSandbox:
    """Stands in for the sandbox to produce failures a real one cannot be made to produce on demand."""

    def __init__(self, outcome: ExecutionOutcome | Exception) -> None:
        self.outcome = outcome
        self.config = SandboxConfig()

    def execute(self, request: Any, *, backend: Any = None, bridge: Any = None) -> ExecutionOutcome:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def close(self) -> None:
        pass


def test_sandbox_unavailable_passes_through() -> None:
    provider = ScriptedProvider([OK_ADD, OK_ADD])
    down = ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, "engine down", backend="docker")
    ws = Workspace(provider=provider, sandbox=_FakeSandbox(down), log=False)  # type: ignore[arg-type]
    out = ws.call("calc", "add", 1)
    assert out.error_type == "sandbox_unavailable" and out.retriable is True
    assert provider.calls == 1


def test_a_sandbox_that_raises_still_gives_an_outcome() -> None:
    provider = ScriptedProvider([OK_ADD])
    ws = Workspace(provider=provider, sandbox=_FakeSandbox(ImportError("no docker module")), log=False)  # type: ignore[arg-type]
    out = ws.call("calc", "add", 1)
    assert out.status == "error" and out.error_type == "sandbox_unavailable"
    assert out.retriable is False and "no docker module" in (out.error_message or "")


class _Store:
    """A ProgramStore: answers lookups from a dict and remembers every record it is shown."""

    def __init__(self, programs: dict[tuple[str, str], ProgramCandidate]) -> None:
        self.programs = programs
        self.lookups: list[GenerationRequest] = []
        self.recorded: list[tuple[ProgramCandidate | None, CallRecord]] = []

    def lookup(self, request: GenerationRequest) -> ProgramCandidate | None:
        self.lookups.append(request)
        return self.programs.get((request.role, request.method))

    def record(self, candidate: ProgramCandidate | None, record: CallRecord) -> None:
        self.recorded.append((candidate, record))


def test_a_persisted_program_runs_through_the_same_path() -> None:
    store = _Store({("calc", "add"): ProgramCandidate(code=OK_ADD, source="persisted", artifact_ref="calc/add@3")})
    provider = ScriptedProvider([])
    calc = Agent.for_role("calc", provider=provider, store=store, sandbox=SandboxConfig(pool_size=0), log=False)
    out = calc.add(4)
    assert out.ok and out.value == 4
    assert provider.calls == 0
    assert out.metadata["program_source"] == "persisted"
    (candidate, record), = store.recorded  # fmt: skip
    assert candidate is not None and candidate.artifact_ref == "calc/add@3"
    assert record.program_source == "persisted" and record.verdict == "approved"
    calc.workspace.close()


def test_a_persisted_program_that_breaks_policy_is_regenerated() -> None:
    store = _Store({("calc", "add"): ProgramCandidate(code=RECOVERABLE, source="persisted")})
    provider = ScriptedProvider([OK_ADD])
    calc = Agent.for_role("calc", provider=provider, store=store, sandbox=SandboxConfig(pool_size=0), log=False)
    out = calc.add(2)
    assert out.ok and out.value == 2
    assert provider.calls == 1 and len(store.lookups) == 1  # retries never go back to the store
    record = store.recorded[0][1]
    assert record.program_source == "generated"
    assert record.attempt_failures[0].program_source == "persisted"
    assert record.attempt_failures[0].error_class == RECOVERABLE_RULE
    calc.workspace.close()


def test_a_broken_store_degrades_to_generation() -> None:
    class Broken:
        def lookup(self, request: GenerationRequest) -> ProgramCandidate | None:
            raise RuntimeError("disk on fire")

        def record(self, candidate: ProgramCandidate | None, record: CallRecord) -> None:
            raise RuntimeError("still on fire")

    provider = ScriptedProvider([OK_ADD])
    calc = Agent.for_role("calc", provider=provider, store=Broken(), sandbox=SandboxConfig(pool_size=0), log=False)
    assert calc.add(1).ok and provider.calls == 1
    calc.workspace.close()
