"""Issue 36: an attempt that ends on a security event (the inner wall's or the tripwire's) is recorded as one
(call log, outcome metadata) and commits nothing, on every backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandforge.runtime.agent import Budgets, CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store.toolstore import LookupStatus, ToolStore
from sandforge.sandbox import SandboxConfig, seam
from tests.agent.conftest import MakeWorkspace, top
from tests.security_programs import (
    EVENT,
    SOURCE,
    TRIP_EVENT,
    TRIP_SOURCE,
    TRIPPING,
    TRIPWIRE_SEAM,
    VIOLATING,
    assert_policy_approves,
    assert_policy_approves_tripping,
)

READ_BACK = "return context.get('leak', 'nothing committed')\n"


def test_a_violating_attempt_is_a_security_event_and_commits_nothing(make_ws: MakeWorkspace, log_path: Path) -> None:
    assert_policy_approves()
    ws, _ = make_ws([VIOLATING, READ_BACK])
    outcome = ws.call("vault", "peek")
    assert outcome.ok and outcome.value == "nothing committed"  # the repair saw the state from before
    assert "leak" not in ws.context("vault")
    rec = top(ws)
    assert rec.rollback_applied and rec.attempts == 2
    [failure] = rec.attempt_failures
    assert failure.error_type == "sandbox_violation"
    assert failure.security_event is not None
    assert (failure.security_event.source, failure.security_event.event) == (SOURCE, EVENT)
    [event] = rec.security_events
    assert (event.source, event.event, event.attempt_number, event.role, event.method) == (
        SOURCE, EVENT, 1, "vault", "peek"
    )  # fmt: skip
    assert event.attempt_id == failure.attempt_id and "update_wrapper" in event.detail
    # the outcome's metadata says so too, and a query of the log file finds it
    [meta] = outcome.metadata["security_events"]
    assert (meta["source"], meta["event"], meta["attempt_id"]) == (SOURCE, EVENT, event.attempt_id)
    assert outcome.metadata["attempt_failures"][0]["security_event"]["event"] == EVENT
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [r["call_id"] for r in lines if r["security_events"]] == [rec.call_id]


def test_a_call_that_ends_on_a_security_event_commits_nothing(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([VIOLATING], execution_repair_budget=0)
    outcome = ws.call("vault", "peek")
    assert not outcome.ok and outcome.error_type == "sandbox_violation"
    assert "leak" not in ws.context("vault")
    rec = top(ws)
    assert rec.attempt_stage == "rolled_back"
    assert [(e.source, e.event, e.attempt_number) for e in rec.security_events] == [(SOURCE, EVENT, 1)]
    assert outcome.metadata["security_events"][0]["source"] == SOURCE


def test_a_call_without_a_security_event_records_none(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws(["raise ValueError('plain failure')\n", "return 1\n"])
    outcome = ws.call("calc", "one")
    assert outcome.ok
    rec = top(ws)
    assert rec.security_events == [] and rec.attempt_failures[0].security_event is None
    assert "security_events" not in outcome.metadata


def test_a_discarded_nested_calls_security_event_stays_in_the_parents_record(make_ws: MakeWorkspace) -> None:
    """A nested call's record is discarded with its parent's rolled-back attempt: its event must not be."""
    parent_fails = "tool('inner').go()\nraise ValueError('the parent fails after its nested call')\n"
    ws, _ = make_ws([parent_fails, VIOLATING, "return 1\n", "return 2\n"])
    outcome = ws.call("outer", "run")
    assert outcome.ok and outcome.value == 2
    assert [r.role for r in ws.log.records] == ["outer"]  # the nested record went with its attempt
    rec = top(ws)
    [nested] = rec.attempt_failures[0].discarded_nested_calls
    assert [(e.role, e.source, e.event) for e in nested.security_events] == [("inner", SOURCE, EVENT)]
    assert [(e.role, e.method, e.event) for e in rec.security_events] == [("inner", "go", EVENT)]
    assert rec.security_events[0].attempt_id.startswith(nested.call_id)


def test_an_attempt_the_tripwire_ends_commits_nothing(
    sandbox_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt wrote context and staged a tool contract before it tripped: no context, no registry entry
    (workspace or store), no stored program; the call log holds the one call, its failed attempt carrying the
    tripwire's event."""
    assert_policy_approves_tripping()
    monkeypatch.setattr(seam, "ACTIVE", TRIPWIRE_SEAM)  # item 1's fix reverted: only the tripwire is left
    log_path = tmp_path / "calls.jsonl"
    ws = Workspace(provider=ScriptedProvider([TRIPPING]), sandbox=SandboxConfig(backend=sandbox_backend, pool_size=0),
                   store=ToolStore(tmp_path / "state"), log=CallLog(log_path),
                   budgets=Budgets(execution_repair_budget=0))  # fmt: skip
    try:
        outcome = ws.call("vault", "peek")
        assert not outcome.ok and outcome.error_type == "sandbox_violation", (outcome.error_type, outcome.error_message)
        assert ws.context("vault") == {}
        assert "helper" not in ws.tools
        store = ws.tool_store
        assert store is not None and store.get_tool("helper") is None
        assert store.lookup("vault", "peek").status == LookupStatus.MISSING
        [rec] = ws.log.records
        assert rec.attempt_stage == "rolled_back"
        [failure] = rec.attempt_failures
        assert failure.security_event is not None
        assert (failure.security_event.source, failure.security_event.event) == (TRIP_SOURCE, TRIP_EVENT)
        assert [(e.source, e.event, e.attempt_number) for e in rec.security_events] == [(TRIP_SOURCE, TRIP_EVENT, 1)]
        assert outcome.metadata["security_events"][0]["source"] == TRIP_SOURCE
        assert [json.loads(line)["call_id"] for line in log_path.read_text().splitlines()] == [rec.call_id]
    finally:
        ws.close()
