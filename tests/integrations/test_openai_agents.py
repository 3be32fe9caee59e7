"""The OpenAI Agents SDK: an ``agents.Agent`` run by ``Runner`` on the SDK's own ``ScriptedModel`` (its ``Model``
interface, no network), with sandforge's function tools."""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from sandforge.integrations.openai_agents import function_tools
from tests.integrations.sessions import FIX, REFUSED, Sessions, calls

OFFLINE = RunConfig(tracing_disabled=True)  # the SDK would export traces to OpenAI's servers otherwise


def outputs(model: ScriptedModel, call: int) -> list[str]:
    """The tool outputs the model was sent in its ``call``-th request."""
    items: list[Any] = model.calls[call].input
    return [str(i["output"]) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


def test_runner_runs_code_sees_the_fix_and_reuses_the_stored_tool(sessions: Sessions) -> None:
    forge, provider = sessions.first()
    model = ScriptedModel([
        [function_call("run_code", {"code": REFUSED}, call_id="c1")],
        [function_call("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}, call_id="c2")],
        [assistant_message("10")],
    ])  # fmt: skip
    agent = Agent(name="calc", instructions="Use the tools.", model=model, tools=function_tools(forge))
    result = Runner.run_sync(agent, "add 2 and 3, then double it", run_config=OFFLINE)
    assert result.final_output == "10"
    assert FIX in outputs(model, 1)[0]  # the refusal's fix reached the model
    assert outputs(model, 2)[-1] == "10" and provider.calls == 1

    forge, provider = sessions.second()
    model = ScriptedModel([
        [function_call("calculator__add", "{not json", call_id="c1")],
        [function_call("calculator__add", {"a": 40, "b": 2}, call_id="c2")],
        [assistant_message("42")],
    ])  # fmt: skip
    agent = Agent(name="calc", instructions="Use the tools.", model=model, tools=function_tools(forge))
    assert Runner.run_sync(agent, "what is 40 + 2?", run_config=OFFLINE).final_output == "42"
    tool = next(t for t in model.calls[0].tools if getattr(t, "name", None) == "calculator__add")
    assert tool.params_json_schema["properties"]["a"] == {"type": "integer", "description": "first addend"}
    assert tool.strict_json_schema
    assert outputs(model, 1)[0].startswith("error [invalid_arguments]: the arguments are not JSON")
    assert json.loads(outputs(model, 2)[-1]) == 42 and provider.calls == 0
    assert [r.program_source for r in calls(forge)] == ["persisted"]
