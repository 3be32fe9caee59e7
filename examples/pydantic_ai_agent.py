"""sandforge's tools as a pydantic-ai toolset: run a program, then call a stored tool by its schema.

    python examples/pydantic_ai_agent.py [STATE_DIR]

Offline as it is: pydantic-ai's FunctionModel plays the model with scripted turns. With a real model, pass
its name instead (``Agent("openai:gpt-4.1", toolsets=[...])``).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandforge.integrations import SandforgeTools
from sandforge.integrations.pydantic_ai import sandforge_toolset
from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore

TURNS: list[tuple[str, dict[str, Any]] | str] = [
    ("run_code", {"code": "import os\nreturn os.getcwd()"}),  # refused: a ModelRetry carrying the fix
    ("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}),
    ("calculator__add", {"a": 40, "b": 2}),  # the role method as a typed tool
    "10, then 42",
]


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for a real model: the next turn of TURNS."""
    turn = TURNS[sum(isinstance(m, ModelResponse) for m in messages)]
    if isinstance(turn, str):
        return ModelResponse(parts=[TextPart(turn)])
    return ModelResponse(parts=[ToolCallPart(turn[0], turn[1])])


def main(state_dir: str) -> str:
    workspace = Workspace(provider=ScriptedProvider(["return args[0] + args[1]\n"]), store=ToolStore(state_dir),
                          log=CallLog(None))  # fmt: skip
    workspace.register_tool("calculator", purpose="add two integers",
                            inputs={"add": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}]})  # fmt: skip
    with workspace:
        agent = Agent(FunctionModel(scripted), toolsets=[sandforge_toolset(SandforgeTools(workspace))])
        result = agent.run_sync("Double 2 + 3, then add 40 and 2.")
        return result.output


if __name__ == "__main__":
    print("output:", main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
