"""sandforge's tools in an OpenAI Agents SDK agent: run a program, then call a stored tool by its schema.

    python examples/openai_agents_agent.py [STATE_DIR]

Offline as it is: the SDK's own ScriptedModel (agents.testing) plays the model and tracing is off. With a
real model, give the Agent ``model="gpt-4.1"`` (or an ``OpenAIChatCompletionsModel`` on any OpenAI-compatible
endpoint) and drop the RunConfig if you want the SDK's traces.
"""

from __future__ import annotations

import sys
import tempfile

from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from sandforge.integrations import SandforgeTools
from sandforge.integrations.openai_agents import function_tools
from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore


def main(state_dir: str) -> str:
    workspace = Workspace(provider=ScriptedProvider(["return args[0] + args[1]\n"]), store=ToolStore(state_dir),
                          log=CallLog(None))  # fmt: skip
    workspace.register_tool("calculator", purpose="add two integers",
                            inputs={"add": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}]})  # fmt: skip
    model = ScriptedModel([
        [function_call("run_code", {"code": "import os\nreturn os.getcwd()"}, call_id="c1")],  # refused: the fix
        [function_call("run_code", {"code": "return tool('calculator').add(2, 3).value * 2"}, call_id="c2")],
        [function_call("calculator__add", {"a": 40, "b": 2}, call_id="c3")],  # the role method as a typed tool
        [assistant_message("10, then 42")],
    ])  # fmt: skip
    with workspace:
        agent = Agent(name="calculator", instructions="Use the tools.", model=model,
                      tools=function_tools(SandforgeTools(workspace)))  # fmt: skip
        result = Runner.run_sync(agent, "Double 2 + 3, then add 40 and 2.",
                                 run_config=RunConfig(tracing_disabled=True))  # fmt: skip
        for item in result.new_items:
            if item.type == "tool_call_output_item":
                print(f"tool: {item.output}")
        return str(result.final_output)


if __name__ == "__main__":
    print("final output:", main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
