"""The session database: schema migrations, WAL, typed errors, round trips."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandforge.runtime.sessions import (
    SCHEMA_VERSION,
    CorruptDatabaseError,
    Message,
    MessageType,
    SchemaTooNewError,
    SessionNotFoundError,
    SessionStore,
    ToolStatus,
    default_db_path,
)
from sandforge.runtime.sessions.db import MIGRATIONS


def _v1_database(path: Path) -> None:
    """A database as the first schema version left it, with one session and a load_tool_group call."""
    conn = sqlite3.connect(path)
    MIGRATIONS[0](conn)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute("INSERT INTO sessions VALUES ('old1', 'legacy', 1.0, 2.0)")
    conn.execute(
        "INSERT INTO messages (session_id, type, content, tool_name, tool_call_id, tool_status, tool_input,"
        " created_at) VALUES ('old1', 'tool_call', '', 'load_tool_group', 't1', 'success',"
        ' \'{"group_name": "google_gmail"}\', 1.5)'
    )
    conn.commit()
    conn.close()


def test_fresh_database_is_current_and_in_wal_mode(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s.db") as store:
        assert store.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_old_schema_is_migrated_and_data_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _v1_database(path)
    with SessionStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        info = store.get_session("old1")
        assert (info.title, info.cleared_from, info.message_count) == ("legacy", None, 1)
        (msg,) = store.messages("old1")
        assert msg.type is MessageType.TOOL_CALL and msg.metadata == {}
        assert msg.tool_input == '{"group_name": "google_gmail"}'
        store.append([Message.assistant("old1", "hi", {"usage": {"output_tokens": 3}})])
        assert store.messages("old1")[-1].metadata == {"usage": {"output_tokens": 3}}
    with SessionStore(path) as again:  # migrating twice is a no-op
        assert again.schema_version == SCHEMA_VERSION
        assert again.get_session("old1").message_count == 2


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SessionStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 1}"):
        SessionStore(path)


def test_corrupt_file_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not an sqlite database at all" * 200)
    with pytest.raises(CorruptDatabaseError, match="corrupt") as exc:
        SessionStore(path)
    assert exc.value.hint


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (x)")
    conn.commit()
    conn.close()
    with pytest.raises(CorruptDatabaseError, match="not a sandforge session database"):
        SessionStore(path)


def test_state_dir_from_argument_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "env"))
    assert default_db_path() == tmp_path / "env" / "sessions.db"
    assert default_db_path(tmp_path / "arg") == tmp_path / "arg" / "sessions.db"
    with SessionStore() as store:
        assert store.path == tmp_path / "env" / "sessions.db"
    monkeypatch.delenv("SANDFORGE_STATE_DIR")
    assert default_db_path().name == "sessions.db"  # the platform's user state directory


def test_round_trip_of_every_message_type(session_store: SessionStore) -> None:
    sid = session_store.create_session().id
    written = session_store.append(
        [
            Message.user(sid, "find spam\nplease"),
            Message.assistant(sid, "on it", {"model": "m"}),
            Message.tool_call(
                sid, name="gmail_search", call_id="t1", tool_input='{"query": "x"}', status=ToolStatus.SUCCESS
            ),
            Message.tool_result(
                sid, name="gmail_search", call_id="t1", content="[]", status=ToolStatus.SUCCESS, metadata={"k": 1}
            ),
        ]
    )
    assert [m.id for m in written] == sorted(m.id for m in written if m.id is not None)
    loaded = session_store.messages(sid)
    assert [(m.type, m.content, m.tool_name, m.tool_call_id, m.tool_status, m.tool_input) for m in loaded] == [
        (m.type, m.content, m.tool_name, m.tool_call_id, m.tool_status, m.tool_input) for m in written
    ]
    assert loaded[3].metadata == {"k": 1} and loaded[0].metadata == {}
    assert session_store.get_session(sid).title == "find spam"


def test_unknown_message_types_and_statuses_are_tolerated(session_store: SessionStore) -> None:
    sid = session_store.create_session().id
    session_store._conn.execute(
        "INSERT INTO messages (session_id, type, tool_status, metadata, created_at) VALUES"
        " (?, 'future_kind', NULL, NULL, 0), (?, 'tool_call', 'weird', '{broken', 0)",
        (sid, sid),
    )
    (msg,) = session_store.messages(sid)
    assert msg.type is MessageType.TOOL_CALL and msg.tool_status is None and msg.metadata == {}


def test_ids_resolve_by_unique_prefix(session_store: SessionStore) -> None:
    a = session_store.create_session().id
    assert session_store.resolve_id(a[:6]) == a
    with pytest.raises(SessionNotFoundError, match="no session 'nope'"):
        session_store.get_session("nope")
    with pytest.raises(SessionNotFoundError):
        session_store.resolve_id("")
    with pytest.raises(SessionNotFoundError):
        session_store.resolve_id("%")  # LIKE wildcards are literal


def test_ambiguous_prefix(session_store: SessionStore) -> None:
    for sid in ("abc1", "abc2"):
        session_store._conn.execute("INSERT INTO sessions (id, created_at, updated_at) VALUES (?, 0, 0)", (sid,))
    with pytest.raises(SessionNotFoundError, match="ambiguous"):
        session_store.resolve_id("abc")


def test_append_to_a_missing_session_fails_cleanly(session_store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError):
        session_store.append([Message.user("missing", "x")])
    assert session_store.list_sessions() == []


def test_list_is_most_recent_first(session_store: SessionStore) -> None:
    a = session_store.create_session().id
    b = session_store.create_session().id
    session_store.append([Message.user(a, "later")])
    assert [s.id for s in session_store.list_sessions()] == [a, b]
    assert [s.id for s in session_store.list_sessions(limit=1)] == [a]
