"""A smolagents CodeAgent whose code steps run in sandforge, with a host tool and a stored sandforge tool.

    python examples/smolagents_agent.py [STATE_DIR]

Offline as it is: a scripted smolagents Model plays the model. With a real one, pass e.g.
``smolagents.OpenAIServerModel(model_id=..., api_base=..., api_key=...)`` to ``code_agent`` instead, and give
the Workspace a real provider (it writes the ``calculator.add`` program the first time it is called).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from smolagents import ChatMessage, Model, tool

from sandforge.integrations import SandforgeTools
from sandforge.integrations.smolagents import code_agent
from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore


class ScriptedModel(Model):  # type: ignore[misc]
    """Stands in for a real model: answers these code steps in turn."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = steps

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role="assistant", content=f"Thought: next.\n<code>\n{self.steps.pop(0)}\n</code>")


@tool
def double(x: int) -> int:
    """Doubles a number (runs on the host; the sandboxed step calls it through sandforge).

    Args:
        x: the number
    """
    return 2 * x


def main(state_dir: str) -> Any:
    # sandforge's own provider writes a role method's program the first time it is called (scripted here)
    workspace = Workspace(provider=ScriptedProvider(["return args[0] + args[1]\n"]), store=ToolStore(state_dir),
                          log=CallLog(None))  # fmt: skip
    workspace.register_tool("calculator", purpose="add two integers",
                            inputs={"add": [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}]})  # fmt: skip
    steps = [
        "import os\nprint(os.listdir('/'))",  # refused by the policy: the model reads the fix next step
        "total = calculator__add(a=2, b=3)\nfinal_answer(double(total))",
    ]
    with workspace:
        agent = code_agent(SandforgeTools(workspace), ScriptedModel(steps), tools=[double], max_steps=4,
                           verbosity_level=0)  # fmt: skip
        return agent.run("Add 2 and 3, then double it.")


if __name__ == "__main__":
    print("final answer:", main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
