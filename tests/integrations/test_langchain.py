"""LangChain: a tool-calling loop (``bind_tools``, ``invoke``, ``ToolMessage``) on langchain-core's fake chat
model, with sandforge's ``StructuredTool`` objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from sandforge.integrations.langchain import langchain_tools
from tests.integrations.sessions import FIX, REFUSED, Sessions, calls


class ToolCallingFake(GenericFakeChatModel):
    """langchain-core's fake chat model, made tool-calling: ``bind_tools`` keeps the schemas it was given."""

    seen: list[list[BaseMessage]] = []
    bound: list[dict[str, Any]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFake:
        self.bound = [convert_to_openai_tool(t) for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen = [*self.seen, list(messages)]
        return super()._generate(messages, *args, **kwargs)


def call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{n}"}])


def loop(model: ToolCallingFake, tools: list[BaseTool], task: str) -> list[BaseMessage]:
    """The tool-calling loop every LangChain agent runs: ask, run the calls, hand back ToolMessages."""
    by_name = {t.name: t for t in tools}
    bound = model.bind_tools(tools)
    messages: list[BaseMessage] = [HumanMessage(task)]
    while True:
        reply = bound.invoke(messages)
        messages.append(reply)
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return messages
        messages += [by_name[c["name"]].invoke(c) for c in reply.tool_calls]


def test_tool_loop_runs_code_sees_the_fix_and_reuses_the_stored_tool(sessions: Sessions) -> None:
    forge, provider = sessions.first()
    script = [call("run_code", {"code": REFUSED}, 1),
              call("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}, 2),
              AIMessage(content="10")]  # fmt: skip
    model = ToolCallingFake(messages=iter(script))
    messages = loop(model, langchain_tools(forge), "add 2 and 3, then double it")
    refused, ran = (m for m in messages if isinstance(m, ToolMessage))
    assert refused.status == "error" and FIX in refused.content
    assert any(isinstance(m, ToolMessage) and FIX in str(m.content) for m in model.seen[1])  # the model saw it
    assert ran.status == "success" and ran.content == "10" and messages[-1].content == "10"
    assert provider.calls == 1

    forge, provider = sessions.second()
    tools = langchain_tools(forge)
    script = [call("calculator__add", {"a": 1, "b": "two"}, 1), call("calculator__add", {"a": 40, "b": 2}, 2),
              AIMessage(content="42")]  # fmt: skip
    model = ToolCallingFake(messages=iter(script))
    messages = loop(model, tools, "what is 40 + 2?")
    schema = next(t["function"]["parameters"] for t in model.bound if t["function"]["name"] == "calculator__add")
    assert schema["properties"] == {"a": {"type": "integer", "description": "first addend"},
                                    "b": {"type": "integer", "description": "second addend"}}  # fmt: skip
    wrong, right = (m for m in messages if isinstance(m, ToolMessage))
    assert wrong.status == "error" and "'two' is not of type 'integer'" in wrong.content
    assert right.content == "42" and provider.calls == 0
    assert [r.program_source for r in calls(forge)] == ["persisted"]
