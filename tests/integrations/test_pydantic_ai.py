"""pydantic-ai: an ``Agent`` run on pydantic-ai's ``FunctionModel`` (scripted turns), with the sandforge toolset."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandforge.integrations.pydantic_ai import sandforge_toolset
from tests.integrations.sessions import FIX, REFUSED, Sessions, calls


class Script:
    """Turns of a model: each a tool call (name, arguments) or a final text; keeps what each turn was sent."""

    def __init__(self, turns: list[tuple[str, dict[str, Any]] | str]) -> None:
        self.turns = list(turns)
        self.sent: list[list[ModelMessage]] = []
        self.tools: dict[str, Any] = {}

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.sent.append(list(messages))
        self.tools = {t.name: t for t in info.function_tools}
        turn = self.turns.pop(0)
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        name, args = turn
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call_{len(self.sent)}")])


def returned(messages: list[ModelMessage]) -> ToolReturnPart:
    """The tool result the model was sent last."""
    (part,) = (
        [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if isinstance(messages[-1], ModelRequest)
        else []
    )
    return part


def test_agent_runs_code_sees_the_fix_and_reuses_the_stored_tool(sessions: Sessions) -> None:
    forge, provider = sessions.first()
    script = Script([("run_code", {"code": REFUSED}),
                     ("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}), "10"])  # fmt: skip
    agent = Agent(FunctionModel(script), toolsets=[sandforge_toolset(forge)])
    assert agent.run_sync("add 2 and 3, then double it").output == "10"
    refused = returned(script.sent[1])
    assert FIX in str(refused.content) and refused.outcome == "retried"  # a ModelRetry the model saw
    assert returned(script.sent[2]).content == "10" and provider.calls == 1

    forge, provider = sessions.second()
    script = Script([("calculator__add", {"a": 40, "b": 2}), "42"])
    agent = Agent(FunctionModel(script), toolsets=[sandforge_toolset(forge)])
    assert agent.run_sync("what is 40 + 2?").output == "42"
    schema = script.tools["calculator__add"].parameters_json_schema
    assert schema["properties"]["b"] == {"type": "integer", "description": "second addend"}
    assert returned(script.sent[1]).content == "42" and provider.calls == 0
    assert [r.program_source for r in calls(forge)] == ["persisted"]


def test_a_failure_the_model_cannot_fix_is_reported_not_raised(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    script = Script([("run_code", {"code": "return 1 / 0"}), "gave up"])
    agent = Agent(FunctionModel(script), toolsets=[sandforge_toolset(forge)])
    assert agent.run_sync("divide").output == "gave up"
    failed = returned(script.sent[1])
    assert "ZeroDivisionError" in str(failed.content) and failed.outcome == "failed"  # ToolFailed: no retry counted
