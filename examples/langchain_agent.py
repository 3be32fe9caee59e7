"""sandforge's tools in a LangChain tool-calling loop: run a program, then call a stored tool by its schema.

    python examples/langchain_agent.py [STATE_DIR]

Offline as it is: langchain-core's fake chat model plays the model. With a real one (``ChatOpenAI``,
``ChatAnthropic``, ...) use ``model.bind_tools(tools)`` as below, or hand the same tools to a LangGraph agent
(``create_react_agent(model, tools)``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from sandforge.integrations import SandforgeTools
from sandforge.integrations.langchain import langchain_tools
from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore


class FakeToolCallingModel(GenericFakeChatModel):
    """langchain-core's fake chat model; a real chat model's ``bind_tools`` sends the tools' schemas."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeToolCallingModel:
        return self


def call(name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{name}"}])


def main(state_dir: str) -> list[BaseMessage]:
    workspace = Workspace(provider=ScriptedProvider(["return args[0] + args[1]\n"]), store=ToolStore(state_dir),
                          log=CallLog(None))  # fmt: skip
    workspace.register_tool("calculator", purpose="add two integers",
                            inputs={"add": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}]})  # fmt: skip
    script = [
        call("run_code", {"code": "import os\nreturn os.getcwd()"}),  # refused: the ToolMessage carries the fix
        call("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}),
        call("calculator__add", {"a": 40, "b": 2}),  # the role method as a typed tool
        AIMessage(content="10, then 42"),
    ]
    with workspace:
        tools = langchain_tools(SandforgeTools(workspace))
        by_name = {t.name: t for t in tools}
        model = FakeToolCallingModel(messages=iter(script)).bind_tools(tools)
        messages: list[BaseMessage] = [HumanMessage("Double 2 + 3, then add 40 and 2.")]
        while True:  # the tool-calling loop: the model asks, the tools answer with ToolMessages
            reply = model.invoke(messages)
            messages.append(reply)
            if not isinstance(reply, AIMessage) or not reply.tool_calls:
                return messages
            messages += [by_name[c["name"]].invoke(c) for c in reply.tool_calls]


if __name__ == "__main__":
    for message in main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()):
        print(f"{message.type}: {message.content or getattr(message, 'tool_calls', '')}")
