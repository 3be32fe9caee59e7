"""smolagents: a real ``CodeAgent`` loop on a scripted smolagents ``Model``, its code steps run in sandforge."""

from __future__ import annotations

from typing import Any

from smolagents import ChatMessage, Model, tool

from sandforge.integrations.smolagents import code_agent
from tests.integrations.sessions import FIX, REFUSED, Sessions, calls


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class ScriptedModel(Model):  # type: ignore[misc]
    """A smolagents model answering scripted code steps, keeping every prompt it was sent."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.prompts: list[str] = []

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None, **kwargs: Any) -> ChatMessage:
        self.prompts.append("\n".join(_text(m.content) for m in messages))
        return ChatMessage(role="assistant", content=f"Thought: next step.\n<code>\n{self.steps.pop(0)}\n</code>")


@tool
def double(x: int) -> int:
    """Doubles a number on the host.

    Args:
        x: the number
    """
    return 2 * x


def test_code_agent_runs_steps_in_sandforge_sees_the_fix_and_reuses_the_stored_tool(sessions: Sessions) -> None:
    forge, provider = sessions.first()
    model = ScriptedModel([REFUSED, "total = calculator__add(a=2, b=3)\nfinal_answer(double(total))"])
    agent = code_agent(forge, model, tools=[double], max_steps=4)
    assert agent.run("add 2 and 3, then double it") == 10
    assert FIX in model.prompts[1] and FIX not in model.prompts[0]  # the refusal's fix reached the model
    assert provider.calls == 1 and calls(forge)[-1].program_source == "generated"

    forge, provider = sessions.second()  # a new workspace on the same store: no program left to generate
    model = ScriptedModel(["print(calculator__add(a=20, b=22))", "final_answer(calculator__add(a=40, b=2))"])
    agent = code_agent(forge, model, max_steps=3)
    assert agent.run("what is 40 + 2?") == 42
    assert "42" in model.prompts[1]  # the first step's output was observed
    assert provider.calls == 0 and {r.program_source for r in calls(forge)} == {"persisted"}


def test_program_state_lives_in_context_and_last_expression_is_the_output(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    model = ScriptedModel(["context['seen'] = [1, 2]\nlen(context['seen'])", "final_answer(sum(context['seen']))"])
    agent = code_agent(forge, model, max_steps=3)
    assert agent.run("keep a list, then sum it") == 3
    assert "Last output from code snippet:\n2" in model.prompts[1]
