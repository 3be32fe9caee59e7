"""Red team on the smolagents executor: tool names and step shapes that would break every step of an agent."""

from __future__ import annotations

from typing import Any

import pytest

from sandforge.integrations.smolagents import SandforgeExecutor
from tests.integrations.sessions import Sessions


class _Tool:
    """What the executor needs of a smolagents tool: a callable (the host side of the stand-in)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.answer


@pytest.mark.parametrize("name", ["class", "tool", "context", "args", "sandforge_call", "not an identifier"])
def test_a_tool_whose_name_is_no_plain_name_leaves_the_steps_working(sessions: Sessions, name: str) -> None:
    forge, _ = sessions.first()
    executor = SandforgeExecutor(forge)
    executor.send_tools({name: _Tool("from the host"), "final_answer": _Tool(None)})
    step = executor(f"context['kept'] = 1\nr = tool({name!r}).call()\n[r.value, context['kept']]")
    assert step.output == ["from the host", 1] and not step.is_final_answer  # reached by tool(name), nothing shadowed


@pytest.mark.parametrize(("code", "output"), [("a = 2; a * 3", 6), ("é = 2; é * 3", 6), ("x = [1,\n 2]\nx[1]", 2)])
def test_the_last_expression_is_the_output_whatever_shares_its_line(sessions: Sessions, code: str, output: int) -> None:
    forge, _ = sessions.first()
    assert SandforgeExecutor(forge)(code).output == output
