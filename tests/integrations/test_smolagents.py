"""smolagents: a real ``CodeAgent`` loop on a scripted smolagents ``Model``, its code steps run in sandforge."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from smolagents import ChatMessage

from sandforge.integrations.smolagents import code_agent
from tests.integrations.sessions import FIX, REFUSED, Sessions, calls


def _example() -> Any:
    """examples/smolagents_agent.py as a module: its scripted model and its host tool, ``double``."""
    path = Path(__file__).resolve().parents[2] / "examples" / "smolagents_agent.py"
    spec = importlib.util.spec_from_file_location("smolagents_agent_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()
double = EXAMPLE.double


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class ScriptedModel(EXAMPLE.ScriptedModel):  # type: ignore[misc,name-defined]
    """The example's scripted model, keeping every prompt it was sent."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(list(steps))
        self.prompts: list[str] = []

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None, **kwargs: Any) -> ChatMessage:
        self.prompts.append("\n".join(_text(m.content) for m in messages))
        return super().generate(messages, stop_sequences, **kwargs)


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


def test_the_runs_variables_are_bound_in_every_step(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    model = ScriptedModel(["n + 1", "final_answer(n * 2)"])
    assert code_agent(forge, model, max_steps=3).run("double n", additional_args={"n": 4}) == 8
