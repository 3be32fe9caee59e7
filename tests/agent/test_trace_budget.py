"""Issue 13 item 6: one budget per trace, nested time charged to the caller's deadline, bridge time logged.

Every test runs on each backend (``make_ws`` is parametrized by ``sandbox_backend``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent import Agent, Budgets, CallLog, CallRecord, TraceBudget, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import Limits, Sandbox

#: Calls ``tool('slow').spin()`` three times and returns what each said; each nested program spins forever.
FAN_SLOW = "outs = []\nfor i in range(3):\n    outs.append(tool('slow').spin().error_type)\nreturn outs\n"
SPIN = "while True:\n    pass\n"
#: A node of a tree: fans out 3 ways until depth 4 (121 calls in all), tolerating failed children.
TREE = (
    "d = args[0]\n"
    "if d >= 4:\n"
    "    return 1\n"
    "total = 1\n"
    "for i in range(3):\n"
    "    o = tool('node').grow(d + 1)\n"
    "    if o.ok:\n"
    "        total += o.value\n"
    "return total\n"
)

MakeTraced = Callable[..., tuple[Workspace, ScriptedProvider]]


@pytest.fixture
def ws_with(sandbox: Sandbox, tmp_path: Path) -> Iterator[MakeTraced]:
    created: list[Workspace] = []

    def factory(
        programs: list[str], *, trace: TraceBudget, limits: Limits | None = None, **budgets: Any
    ) -> tuple[Workspace, ScriptedProvider]:
        provider = ScriptedProvider(programs)
        ws = Workspace(
            provider=provider, sandbox=sandbox,
            log=CallLog(tmp_path / "calls.jsonl"), budgets=Budgets(**budgets), limits=limits, trace_budget=trace,
        )  # fmt: skip
        created.append(ws)
        return ws, provider

    yield factory
    for ws in created:
        ws.close()


def records(ws: Workspace) -> list[CallRecord]:
    return ws.log.records


def test_nested_time_is_charged_to_the_callers_timeout(ws_with: MakeTraced) -> None:
    # Before: each nested call got its own 2 s and the caller's deadline moved by it: ok after ~6 s.
    ws, _ = ws_with([FAN_SLOW, SPIN, SPIN, SPIN], trace=TraceBudget(), limits=Limits(timeout_s=2))
    out = Agent.for_role("boss", workspace=ws).run()
    assert out.error_type == "timeout", out
    top = next(r for r in records(ws) if r.depth == 0)
    assert top.status == "error" and top.error_type == "timeout"
    assert top.usage.bridge_duration_s > 0  # the time it waited for its nested call is on the record
    assert top.trace_usage is not None and top.trace_usage.nested_calls >= 1


def test_a_nested_call_gets_at_most_the_callers_remaining_time(ws_with: MakeTraced) -> None:
    # The caller catches its nested call's failure and returns; the nested call could not outlive it.
    caller = "o = tool('slow').spin()\nreturn o.error_type\n"
    ws, provider = ws_with([caller, SPIN], trace=TraceBudget(), limits=Limits(timeout_s=2))
    out = Agent.for_role("boss", workspace=ws).run()
    # Either the child's timeout reached the caller after the caller's own deadline (timeout), or not at
    # all: never an ok answer bought with time beyond the caller's limit.
    assert out.error_type == "timeout", out
    assert provider.calls == 2  # the nested call did run (and was cut at the caller's deadline)


def test_fan_out_is_bounded_by_the_provider_budget(ws_with: MakeTraced) -> None:
    trace = TraceBudget(max_nested_calls=1000, max_provider_calls=10, max_sandboxes=1000)
    ws, provider = ws_with([TREE] * 200, trace=trace, limits=Limits(timeout_s=30))
    out = Agent.for_role("node", workspace=ws).grow(0)
    assert out.ok, out  # the tree tolerates failed children
    assert provider.calls == 10  # not 121
    exhausted = [r for r in records(ws) if r.error_type == "budget_exhausted"]
    assert exhausted and all(r.failure_class == "extrinsic" for r in exhausted)
    top = next(r for r in records(ws) if r.depth == 0)
    assert top.trace_usage is not None
    assert top.trace_usage.provider_calls == 10 and top.trace_usage.exhausted == "max_provider_calls"


def test_fan_out_is_bounded_by_the_nested_call_budget(ws_with: MakeTraced) -> None:
    trace = TraceBudget(max_nested_calls=5, max_provider_calls=100, max_sandboxes=100)
    ws, provider = ws_with([TREE] * 200, trace=trace, limits=Limits(timeout_s=30))
    out = Agent.for_role("node", workspace=ws).grow(0)
    assert out.ok, out
    assert provider.calls == 6  # the top-level call and 5 nested calls
    top = next(r for r in records(ws) if r.depth == 0)
    assert top.trace_usage is not None and top.trace_usage.exhausted == "max_nested_calls"
    assert top.trace_usage.nested_calls == 5


def test_repairs_draw_on_the_same_budget(ws_with: MakeTraced) -> None:
    # Each nested call's program raises, and its repair lane regenerates: every generation is counted.
    caller = "outs = []\nfor i in range(10):\n    outs.append(tool('broken').go().error_type)\nreturn outs\n"
    broken = "return 1 // 0\n"
    trace = TraceBudget(max_nested_calls=100, max_provider_calls=7, max_sandboxes=100)
    ws, provider = ws_with(
        [caller] + [broken] * 50, trace=trace, limits=Limits(timeout_s=60), execution_repair_budget=1
    )
    out = Agent.for_role("boss", workspace=ws).run()
    assert out.ok and provider.calls == 7
    assert isinstance(out.value, list) and out.value[-1] == "budget_exhausted"


def test_sandbox_budget_is_a_typed_outcome(ws_with: MakeTraced) -> None:
    ws, _ = ws_with([TREE] * 50, trace=TraceBudget(max_sandboxes=1, max_provider_calls=50))
    out = Agent.for_role("node", workspace=ws).grow(3)
    assert out.ok and out.value == 1  # every child was refused a sandbox
    child = next(r for r in records(ws) if r.depth == 1)
    assert child.error_type == "budget_exhausted"
    assert "max_sandboxes" in (child.error_message or "")


def test_the_trace_wall_clock_ends_a_top_level_call(ws_with: MakeTraced) -> None:
    ws, _ = ws_with([SPIN], trace=TraceBudget(max_wall_s=1), limits=Limits(timeout_s=30))
    out = Agent.for_role("boss", workspace=ws).spin()
    assert out.error_type == "budget_exhausted" and out.metadata["budget_limit"] == "max_wall_s"
    assert out.metadata["failure_class"] == "extrinsic"


def test_trace_budget_from_env_and_defaults() -> None:
    env = {"SANDFORGE_TRACE_MAX_PROVIDER_CALLS": "7", "SANDFORGE_TRACE_MAX_WALL_S": "12.5"}
    budget = TraceBudget.from_env(env)
    assert (budget.max_provider_calls, budget.max_wall_s) == (7, 12.5)
    assert budget.max_nested_calls == TraceBudget().max_nested_calls
    assert TraceBudget.from_env(env, max_sandboxes=3).max_sandboxes == 3
    with pytest.raises(ValueError, match="invalid trace budget max_sandboxes"):
        TraceBudget.from_env({"SANDFORGE_TRACE_MAX_SANDBOXES": "lots"})
    with pytest.raises(ValueError, match="max_wall_s"):
        TraceBudget.from_env({"SANDFORGE_TRACE_MAX_WALL_S": "-1"})
