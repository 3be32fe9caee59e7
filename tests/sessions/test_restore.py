"""RFC-044: groups loaded in earlier turns are restored at the start of every send, before the model call.

One test per row of the RFC's edge-case table, plus the RFC's unit test of the scan itself.
"""

from __future__ import annotations

import uuid

import pytest

from sandforge.runtime.sessions import Message, MessageType, SessionStore, ToolStatus, restore_loaded_groups
from tests.sessions.helpers import CORE, GMAIL, call, load, make_session, registry

GMAIL_TOOLS = ["gmail_search", "gmail_trash"]


def _load_row(session_id: str, tool_input: str | None, status: ToolStatus = ToolStatus.SUCCESS) -> list[Message]:
    call_id = f"toolu_{uuid.uuid4().hex}"
    return [
        Message(
            session_id=session_id,
            type=MessageType.TOOL_CALL,
            tool_name="load_tool_group",
            tool_call_id=call_id,
            tool_input=tool_input,
            tool_status=status,
        ),
        Message.tool_result(session_id, name="load_tool_group", call_id=call_id, content="", status=status),
    ]


def test_rfc_unit_scan_counts_only_successful_loads() -> None:
    s = "s1"
    messages = [
        Message(session_id=s, type=MessageType.USER, content="check email"),
        Message(
            session_id=s,
            type=MessageType.TOOL_CALL,
            tool_name="load_tool_group",
            tool_status=ToolStatus.SUCCESS,
            tool_input='{"group_name": "google_gmail"}',
        ),
        Message(session_id=s, type=MessageType.TOOL_RESULT, tool_name="load_tool_group"),
        Message(session_id=s, type=MessageType.TOOL_CALL, tool_name="gmail_search", tool_status=ToolStatus.SUCCESS),
        Message(
            session_id=s,
            type=MessageType.TOOL_CALL,
            tool_name="load_tool_group",
            tool_status=ToolStatus.ERROR,
            tool_input='{"group_name": "google_drive"}',
        ),
    ]
    assert restore_loaded_groups(messages) == ["google_gmail"]  # google_drive excluded: status ERROR


def test_scan_ignores_other_message_types_and_names() -> None:
    s = "s1"
    messages = [
        # a tool_result (not a call) carrying the same input shape
        Message(
            session_id=s,
            type=MessageType.TOOL_RESULT,
            tool_name="load_tool_group",
            tool_status=ToolStatus.SUCCESS,
            tool_input='{"group_name": "a"}',
        ),
        # another tool whose input happens to have group_name
        Message(
            session_id=s,
            type=MessageType.TOOL_CALL,
            tool_name="other",
            tool_status=ToolStatus.SUCCESS,
            tool_input='{"group_name": "b"}',
        ),
        # no status at all
        Message(
            session_id=s, type=MessageType.TOOL_CALL, tool_name="load_tool_group", tool_input='{"group_name": "c"}'
        ),
    ]
    assert restore_loaded_groups(messages) == []


# --- the edge-case table, end to end through Session.send ---------------------------------------------------


def test_new_session_starts_with_core_tools_only(session_store: SessionStore) -> None:
    session, provider = make_session(session_store, ["hello"])
    result = session.send("hi")
    assert provider.requests[0].tool_names == CORE
    assert result.restored_groups == []
    assert result.active_groups == []
    assert session.active_groups() == []


def test_clear_creates_a_new_session_with_core_tools_only(session_store: SessionStore) -> None:
    session, provider = make_session(session_store, [load("google_gmail"), "loaded", "fresh", "still loaded"])
    session.send("load gmail")
    cleared = session.clear()
    assert cleared.id != session.id
    assert cleared.info.cleared_from == session.id
    assert cleared.history() == []
    assert cleared.active_groups() == []
    result = cleared.send("after /clear")
    assert provider.requests[-1].tool_names == CORE
    assert result.restored_groups == []
    # the old session keeps its history, and with it its groups
    again = session.send("back in the old session")
    assert again.restored_groups == ["google_gmail"]
    assert provider.requests[-1].tool_names == CORE + GMAIL_TOOLS


def test_failed_load_in_history_is_skipped(session_store: SessionStore) -> None:
    # a failure through the loop (missing group_name) and an ERROR row for a group that does exist
    session, provider = make_session(
        session_store, [call("load_tool_group"), load("no_such_group"), "both failed", "turn 2"]
    )
    first = session.send("load something")
    assert [c.status for c in first.tool_calls] == [ToolStatus.ERROR, ToolStatus.ERROR]
    assert "Unknown tool group 'no_such_group'" in first.tool_calls[1].content
    session_store.append(_load_row(session.id, '{"group_name": "google_drive"}', ToolStatus.ERROR))
    second = session.send("go on")
    assert second.restored_groups == []
    assert provider.requests[-1].tool_names == CORE


def test_same_group_loaded_several_times_is_restored_once(session_store: SessionStore) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "load_tool_group", "input": {"group_name": "google_gmail"}},
                {"name": "load_tool_group", "input": {"group_name": "google_gmail"}},
            ]
        },
        "loaded twice",
        load("google_gmail"),  # turn 2: the model reloads it anyway
        "and a third time",
        "turn 3",
    ]
    session, provider = make_session(session_store, turns)
    first = session.send("load gmail")
    assert first.tool_calls[1].content.startswith("Tool group 'google_gmail' is already loaded")
    second = session.send("again")
    assert second.tool_calls[0].status is ToolStatus.SUCCESS
    third = session.send("third")
    assert third.restored_groups == ["google_gmail"]
    names = provider.requests[-1].tool_names
    assert names == CORE + GMAIL_TOOLS
    assert len(names) == len(set(names))


def test_group_that_no_longer_exists_is_harmless(session_store: SessionStore) -> None:
    session_store_session, _ = make_session(session_store, [])
    sid = session_store_session.id
    session_store.append([Message.user(sid, "long ago")])
    session_store.append(_load_row(sid, '{"group_name": "retired_group"}'))
    session_store.append(_load_row(sid, '{"group_name": "google_gmail"}'))
    session, provider = make_session(session_store, [call("retired_tool"), "ok"], session_id=sid)
    result = session.send("use the old tool")
    assert result.restored_groups == ["retired_group", "google_gmail"]
    assert result.active_groups == ["google_gmail"]
    assert provider.requests[0].tool_names == CORE + GMAIL_TOOLS
    assert result.tool_calls[0].status is ToolStatus.ERROR
    assert result.tool_calls[0].content == "Tool 'retired_tool' is not available for this agent"
    assert session.active_groups() == ["google_gmail"]


@pytest.mark.parametrize(
    "bad_input",
    [
        "{not json",
        "[]",
        '"google_drive"',
        "null",
        '{"group_name": 5}',
        '{"group_name": ""}',
        '{"name": "calendar"}',
        "",
        None,
    ],
)
def test_malformed_tool_input_is_skipped(session_store: SessionStore, bad_input: str | None) -> None:
    seed, _ = make_session(session_store, [])
    session_store.append([Message.user(seed.id, "old turn")])
    session_store.append(_load_row(seed.id, bad_input))
    session_store.append(_load_row(seed.id, '{"group_name": "google_gmail"}'))
    session, provider = make_session(session_store, ["fine"], session_id=seed.id)
    result = session.send("next")
    assert result.restored_groups == ["google_gmail"]
    assert provider.requests[0].tool_names == CORE + GMAIL_TOOLS


def test_legacy_upper_case_status_counts_as_success(session_store: SessionStore) -> None:
    seed, _ = make_session(session_store, [])
    session_store.append([Message.user(seed.id, "old")])
    conn = session_store._conn  # a row as the Kotlin app wrote it: upper-case enum name
    conn.execute(
        "INSERT INTO messages (session_id, type, content, tool_name, tool_status, tool_input, created_at)"
        " VALUES (?, 'tool_call', '', 'load_tool_group', 'SUCCESS', '{\"group_name\": \"calendar\"}', 0)",
        (seed.id,),
    )
    session, _ = make_session(session_store, ["fine"], session_id=seed.id)
    assert session.send("next").restored_groups == ["calendar"]


def test_restore_needs_no_extra_model_call(session_store: SessionStore) -> None:
    session, provider = make_session(
        session_store, [load("google_gmail"), "loaded", call("gmail_search", query="x"), "done"]
    )
    session.send("load")
    second = session.send("search")
    assert second.model_calls == 2  # tool call + final answer; no reload round-trip
    assert len(provider.requests) == 4
    assert provider.requests[2].tool_names == CORE + GMAIL_TOOLS  # already in the first request of turn 2


def test_groups_offered_to_the_model_only_after_loading(session_store: SessionStore) -> None:
    session, provider = make_session(session_store, [load("google_gmail"), "ok"], reg=registry(GMAIL))
    session.send("load")
    assert provider.requests[0].tool_names == CORE
    assert provider.requests[1].tool_names == CORE + GMAIL_TOOLS
    schemas = {t["name"]: t for t in provider.requests[1].tools}
    assert schemas["gmail_search"]["input_schema"]["required"] == ["query"]
    assert "google_gmail" in provider.requests[0].system  # the group list, not its schemas
