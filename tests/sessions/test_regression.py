"""The bug RFC-044 fixes: a group loaded in turn 1 is gone in turn 2 ("Tool 'X' is not available")."""

from __future__ import annotations

from sandforge.runtime.sessions import SessionStore, ToolStatus
from tests.sessions.helpers import RecordingRunner, call, load, make_session

SCRIPT = [
    # turn 1: load the group, use one of its tools
    load("google_gmail"),
    call("gmail_search", query="from:spam"),
    "Found 3 spam messages.",
    # turn 2: use another tool of the group, without reloading
    call("gmail_trash", id=7),
    "Trashed.",
]


def test_turn_two_uses_a_group_tool_without_reloading(session_store: SessionStore) -> None:
    runner = RecordingRunner()
    session, provider = make_session(session_store, SCRIPT, runner=runner)
    first = session.send("find spam")
    assert [c.status for c in first.tool_calls] == [ToolStatus.SUCCESS, ToolStatus.SUCCESS]
    second = session.send("trash message 7")
    assert [c.name for c in second.tool_calls] == ["gmail_trash"]
    assert second.tool_calls[0].status is ToolStatus.SUCCESS
    assert second.text == "Trashed."
    assert runner.calls == [("gmail", "search", {"query": "from:spam"}), ("gmail", "trash", {"id": 7})]
    assert provider.remaining == 0


def test_without_restore_the_same_script_fails_with_not_available(session_store: SessionStore) -> None:
    runner = RecordingRunner()
    session, provider = make_session(session_store, SCRIPT, runner=runner, restore_groups=False)
    session.send("find spam")
    second = session.send("trash message 7")
    assert second.tool_calls[0].status is ToolStatus.ERROR
    assert second.tool_calls[0].content == "Tool 'gmail_trash' is not available for this agent"
    assert runner.calls == [("gmail", "search", {"query": "from:spam"})]  # trash never ran
    # the model saw the failure as an error tool_result
    last = provider.requests[-1].messages[-1]["content"][0]
    assert last["type"] == "tool_result" and last["is_error"] is True


def test_restore_survives_a_new_process_view_of_the_session(session_store: SessionStore) -> None:
    """Turn 2 in a fresh Session object (as after a restart) restores from the database alone."""
    session, _ = make_session(session_store, SCRIPT[:3])
    session.send("find spam")
    reopened, _ = make_session(session_store, SCRIPT[3:], session_id=session.id[:8])
    assert reopened.id == session.id
    assert reopened.active_groups() == ["google_gmail"]
    second = reopened.send("trash message 7")
    assert second.tool_calls[0].status is ToolStatus.SUCCESS
