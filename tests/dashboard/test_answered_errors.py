"""Issue 37 item 3: a program's own ``Outcome.error`` is an answer, counted apart from failures on the dashboard
(an "answered with an error" series beside failures; the error rate counts failures only)."""

from __future__ import annotations

from pathlib import Path

from sandforge.runtime.agent import Agent, Budgets, CallLog, Workspace
from sandforge.runtime.dashboard.render import chart
from sandforge.runtime.dashboard.views import Board, overview_page
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import SandboxConfig
from tests.store.test_health_attribution import store_program

#: divides as designed: ``Outcome.error`` for 0 is its answer, not a crash
DIVIDE = (
    "if args[0] == 0:\n    return Outcome.error('division_by_zero', 'cannot divide by zero')\nreturn 100 // args[0]\n"
)
CRASH = "return 100 // args[0]\n"


def test_answers_with_an_error_are_counted_apart_from_failures(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store_program(state, "calc", "divide", DIVIDE)
    store_program(state, "calc", "crash", CRASH)
    log = state / "logs" / "calls.jsonl"
    sandbox, no_repair = SandboxConfig(backend="subprocess", pool_size=1), Budgets(execution_repair_budget=0)
    with Workspace(provider=ScriptedProvider([]), sandbox=sandbox, store=ToolStore(state), log=CallLog(log),
                   budgets=no_repair) as ws:  # fmt: skip
        calc = Agent.for_role("calc", workspace=ws)
        assert calc.divide(4).value == 25
        answer = calc.divide(0)
        assert answer.error_type == "division_by_zero" and answer.metadata["tool_error"] is True
        assert calc.crash(0).error_type == "execution"  # a real failure (ZeroDivisionError)

    board = Board(tenant="t", store=ToolStore(state), call_log=log, policy=default_policy(),
                  sandbox=SandboxConfig(backend="subprocess"))  # fmt: skip
    page = overview_page(board)
    assert (page.calls_last_hour, page.failures_last_hour, page.answered_last_hour) == (3, 1, 1)
    assert (page.calls_last_day, page.failures_last_day, page.answered_last_day) == (3, 1, 1)
    assert page.error_rate_last_day == round(1 / 3, 4)
    assert page.top_failure_types == [("execution", 1)] and page.top_answer_types == [("division_by_zero", 1)]
    now = page.chart[-1]
    assert (now.calls, now.failures, now.answered) == (3, 1, 1)
    bar = chart([p.model_dump() for p in page.chart])["bars"][-1]
    assert bar["answered"] == 1 and bar["ah"] > 0 and bar["ay"] == round(bar["fy"] - bar["ah"], 1)
