"""Committed contexts are kept as snapshots: unchanged keys keep their bytes across calls, nothing a failed
attempt did is committed, and the public Workspace API still speaks dicts."""

from __future__ import annotations

import pytest

from sandforge.runtime.agent import Agent
from sandforge.sandbox.context import ContextSnapshot
from tests.agent.conftest import MakeWorkspace

BUMP = "context['memory'] = context.get('memory', 0) + args[0]\nreturn len(context)\n"
POLLUTE = "context['memory'] = 999\ncontext['big'].append('x')\ndel context['keep']\nreturn 1 / 0\n"

pytestmark = pytest.mark.parametrize("sandbox_backend", ["subprocess"])


def test_unchanged_keys_keep_their_bytes_across_calls(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([BUMP, BUMP, BUMP])
    calc = Agent.for_role("calc", workspace=ws, context={"big": ["row"] * 20_000, "keep": {"a": 1}})
    big = ws.context_snapshot("calc")["big"]
    for step in (1, 2, 3):
        out = calc.add(step)
        assert out.ok and out.value == 3, out
        assert ws.context_snapshot("calc")["big"] is big  # neither re-encoded nor re-decoded
    assert calc.context == {"big": ["row"] * 20_000, "keep": {"a": 1}, "memory": 6}
    assert provider.requests[-1].context_summary["big"].startswith("list = ['row', 'row'")


def test_a_failed_attempt_commits_nothing(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([POLLUTE], execution_repair_budget=0)
    calc = Agent.for_role("calc", workspace=ws, context={"big": ["row"], "keep": 1, "memory": 1})
    before = ws.context_snapshot("calc")
    out = calc.add(1)
    assert out.error_type == "execution"
    assert ws.context_snapshot("calc") is before
    assert calc.context == {"big": ["row"], "keep": 1, "memory": 1}


def test_workspace_context_api_speaks_dicts(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([])
    ws.set_context("r", {"a": [1], 2: "int key, converted as json.dumps does"})
    ws.update_context("r", "b", {"x": None})
    ws.delete_context("r", "a")
    copy = ws.context("r")
    assert copy == {"2": "int key, converted as json.dumps does", "b": {"x": None}}
    copy["b"]["x"] = "mutated"
    assert ws.context("r")["b"] == {"x": None}
    assert isinstance(ws.context_snapshot("r"), ContextSnapshot)
    with pytest.raises(KeyError):
        ws.delete_context("r", "a")
    for bad in ({"s": {1, 2}}, {"f": float("nan")}):
        with pytest.raises(TypeError):
            ws.set_context("r", bad)
    with pytest.raises(TypeError):
        ws.update_context("r", "s", {1, 2})
    with pytest.raises(TypeError):
        ws.set_context("r", [1])  # type: ignore[arg-type]
    assert ws.context("nobody") == {}
