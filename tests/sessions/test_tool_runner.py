"""The session's tool runner calls a typed seam: ``ToolAgent.call(method, ...)`` answering a ``ToolOutcome``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import JsonValue

from sandforge.runtime.agent import Agent, Outcome
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.sessions import AgentToolRunner, ToolAgent, ToolGroup, ToolOutcome, ToolSpec, outcome_to_result
from sandforge.sandbox import Sandbox, SandboxConfig

GROUP = ToolGroup(
    name="mem",
    role="memo",
    tools=(
        ToolSpec(name="recall", method="memory"),  # a method named like a context key of the role
        ToolSpec(name="call_it", method="call"),  # and one named like the Agent's reserved ``call``
        ToolSpec(name="add", arguments="args_kwargs"),
    ),
)


@dataclass(frozen=True)
class PlainOutcome:
    """Not an ``Outcome``: any object with the fields a runner reads is a ToolOutcome."""

    status: str
    value: JsonValue = None
    error_type: str | None = None
    error_message: str | None = None
    retriable: bool = False
    tool_role: str = "memo"
    method_name: str = "m"
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordingAgent:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)

    def call(self, method: str, *args: Any, **kwargs: Any) -> ToolOutcome:
        self.calls.append((method, args, kwargs))
        if method == "add":
            return PlainOutcome(status="error", error_type="overflow", error_message="too big", retriable=True)
        return PlainOutcome(status="ok", value={"method": method}, metadata={"call_id": "c1", "secret": "kept out"})


def test_the_runner_calls_the_tool_agent_with_the_method_name() -> None:
    agent = RecordingAgent()
    roles: list[str] = []

    def factory(role: str) -> ToolAgent:
        roles.append(role)
        return agent

    runner = AgentToolRunner(agent_factory=factory)
    first = runner.run(GROUP, GROUP.tools[0], {"x": 1})
    assert first.ok and first.content == '{"method": "memory"}'
    assert first.metadata == {"retriable": False, "tool_role": "memo", "method_name": "m", "call_id": "c1"}
    assert runner.run(GROUP, GROUP.tools[1], {}).content == '{"method": "call"}'
    failed = runner.run(GROUP, GROUP.tools[2], {"args": [1, 2], "kwargs": {"k": 3}})
    assert not failed.ok and failed.content == "overflow (retriable): too big"
    assert agent.calls == [("memory", (), {"x": 1}), ("call", (), {}), ("add", (1, 2), {"k": 3})]
    assert roles == ["memo"]  # the agent is made once per role, then cached


def test_an_agent_outcome_is_a_tool_outcome() -> None:
    outcome: ToolOutcome = Outcome(status="ok", value=[1], tool_role="r", method_name="m", metadata={"attempts": 1})
    assert outcome_to_result(outcome).model_dump() == {
        "ok": True,
        "content": "[1]",
        "metadata": {"retriable": False, "tool_role": "r", "method_name": "m", "attempts": 1},
    }


@pytest.fixture(scope="module")
def subprocess_sandbox() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1))
    try:
        yield sb
    finally:
        sb.close()


def test_a_method_named_like_a_context_key_runs_as_a_tool(subprocess_sandbox: Sandbox) -> None:
    """The real Agent: ``call(method)`` makes the dynamic call even where attribute access would read the
    context (``agent.memory`` is the value) or the reserved ``call``."""
    provider = ScriptedProvider(["return ['recalled', context['memory']]", "return 'called'"])
    runner = AgentToolRunner(provider=provider, sandbox=subprocess_sandbox, log=False)
    try:
        agent = runner.agent("memo")
        assert isinstance(agent, Agent)
        assert runner.workspace is not None
        runner.workspace.set_context("memo", {"memory": 7})
        recalled = runner.run(GROUP, GROUP.tools[0], {})
        assert recalled.ok and recalled.content == '["recalled", 7]'
        called = runner.run(GROUP, GROUP.tools[1], {})
        assert called.ok and called.content == '"called"'
        assert [(r.role, r.method) for r in provider.requests] == [("memo", "memory"), ("memo", "call")]
    finally:
        runner.close()
