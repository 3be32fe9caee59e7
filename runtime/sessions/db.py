"""The session database: SQLite (stdlib), one file under the state directory, WAL, versioned migrations.

Layout (schema version 2)::

    schema_version(version)                       one row; absent table = empty database (version 0)
    sessions(id, title, created_at, updated_at, cleared_from)
    messages(id, session_id, type, content, tool_name, tool_call_id, tool_status, tool_input,
             created_at, metadata)

Message order is ``messages.id`` (AUTOINCREMENT, so it only grows). Every write is one ``BEGIN IMMEDIATE``
transaction, so several processes can share one file: writers queue on SQLite's lock (``busy_timeout``),
readers never block in WAL mode. A database written by a newer sandforge is refused (SchemaTooNewError);
an older one is migrated in place, inside the same write lock, so two processes racing on a fresh file
migrate it once.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from sandforge.runtime.files.sqlite import enable_wal, immediate, is_busy, private_db_file
from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.sessions.errors import (
    CorruptDatabaseError,
    SchemaTooNewError,
    SessionNotFoundError,
    SessionStoreError,
    SessionStoreIOError,
)
from sandforge.runtime.sessions.models import Message, MessageType, SessionInfo, ToolStatus
from sandforge.runtime.state_dir import resolve_state_dir

log = logging.getLogger(__name__)

DB_FILE_NAME = "sessions.db"
TITLE_MAX = 60


def state_dir(override: Path | str | None = None) -> Path:
    """The state directory: ``override``, else ``$SANDFORGE_STATE_DIR``, else the platform's user state dir."""
    return resolve_state_dir(override)


def default_db_path(state: Path | str | None = None) -> Path:
    return state_dir(state) / DB_FILE_NAME


# --- migrations: MIGRATIONS[v] upgrades a version-v database to v+1 --------------------------------------


def _m0_initial(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE sessions ("
        " id TEXT PRIMARY KEY,"
        " title TEXT NOT NULL DEFAULT '',"
        " created_at REAL NOT NULL,"
        " updated_at REAL NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE messages ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " type TEXT NOT NULL,"
        " content TEXT NOT NULL DEFAULT '',"
        " tool_name TEXT,"
        " tool_call_id TEXT,"
        " tool_status TEXT,"
        " tool_input TEXT,"
        " created_at REAL NOT NULL)"
    )
    conn.execute("CREATE INDEX messages_by_session ON messages(session_id, id)")


def _m1_lineage_and_metadata(conn: sqlite3.Connection) -> None:
    # cleared_from: the session `/clear` replaced (lineage for `sessions show`); metadata: a JSON object per
    # message (usage, stop reason, tool outcome diagnostics) that is never sent back to the model.
    conn.execute("ALTER TABLE sessions ADD COLUMN cleared_from TEXT")
    conn.execute("ALTER TABLE messages ADD COLUMN metadata TEXT")
    conn.execute("CREATE INDEX sessions_by_update ON sessions(updated_at)")


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_m0_initial, _m1_lineage_and_metadata)
SCHEMA_VERSION = len(MIGRATIONS)


_STATUSES = {s.value: s.value for s in ToolStatus}
_TYPES = frozenset(t.value for t in MessageType)
_MESSAGES = TypeAdapter(list[Message])


def _status(value: str | None) -> str | None:
    """Stored status, tolerant of legacy spellings (``SUCCESS``); anything unknown reads as no status."""
    if value is None:
        return None
    return _STATUSES.get(value) or _STATUSES.get(value.lower())


def _metadata(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # hand-edited rows: deep nesting, 5,000-digit ints
        return {}
    return value if isinstance(value, dict) else {}


_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, type, content, tool_name, tool_call_id, tool_status, tool_input,"
    " created_at, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_MESSAGES = (
    "SELECT id, session_id, type, content, tool_name, tool_call_id, tool_status, tool_input, created_at,"
    " metadata FROM messages WHERE session_id = ? ORDER BY id"
)


def _rows_to_messages(rows: list[tuple[Any, ...]]) -> list[Message]:
    """Rows to Messages in one pydantic validation pass (faster than constructing them one by one).

    Rows of a message type this version does not know are skipped (not ours to interpret); a malformed
    ``tool_input`` is kept as stored; malformed metadata reads as ``{}``.
    """
    items = [
        {
            "id": r[0],
            "session_id": r[1],
            "type": r[2],
            "content": r[3] or "",
            "tool_name": r[4],
            "tool_call_id": r[5],
            "tool_status": _status(r[6]),
            "tool_input": r[7],
            "created_at": r[8],
            "metadata": _metadata(r[9]) if r[9] else {},
        }
        for r in rows
        if r[2] in _TYPES
    ]
    if len(items) != len(rows):
        log.debug("skipped %d message(s) of unknown type", len(rows) - len(items))
    return _MESSAGES.validate_python(items)


def _map_error(exc: sqlite3.Error, path: Path) -> SessionStoreError:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "file is encrypted" in text
    ):
        return CorruptDatabaseError(
            f"session database {path} is corrupt: {text}",
            hint="move the file aside; a new empty database is created on the next run",
        )
    if is_busy(exc):
        return SessionStoreError(
            f"session database {path} is busy: {text}", hint="another sandforge process holds a write lock"
        )
    if "disk is full" in text or "readonly" in text or "disk I/O error" in text:
        return SessionStoreIOError(f"session database {path}: {text}")
    return SessionStoreError(f"session database {path}: {text}")


def _private_db_file(path: Path) -> None:
    """The database file made private and checked (``runtime.files.sqlite.private_db_file``), errors typed."""

    def refuse(kind: str) -> SessionStoreError:
        return SessionStoreError(f"session database {path} is {kind}, not a regular file; refused")

    try:
        private_db_file(path, refuse)
    except OSError as exc:
        raise SessionStoreIOError(f"cannot open session database {path}: {exc.strerror or exc}") from None


class SessionStore:
    """All sessions and their messages, in one SQLite file. Thread-safe; safe across processes."""

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        state: Path | str | None = None,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path) if path is not None else default_db_path(state)
        self._lock = threading.RLock()
        _private_db_file(self.path)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _map_error(exc, self.path) from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            mode = enable_wal(self._conn, busy_timeout_s)
            if mode != "wal":
                log.warning("session database %s: journal mode is %s, not wal", self.path, mode)
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self.schema_version = self._migrate()
        except sqlite3.Error as exc:
            self._conn.close()
            raise _map_error(exc, self.path) from exc
        except BaseException:
            self._conn.close()
            raise

    # --- plumbing ---------------------------------------------------------------------------------------

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``runtime.files.sqlite.immediate``), its errors typed."""
        return immediate(self._conn, self._lock, lambda exc: _map_error(exc, self.path))

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise _map_error(exc, self.path) from exc

    def _read_version(self, conn: sqlite3.Connection) -> int:
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if not has_table:
            others = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
            if others and others[0]:
                raise CorruptDatabaseError(
                    f"{self.path} is an SQLite database but not a sandforge session database (no schema_version table)",
                    hint="point --state-dir or SANDFORGE_STATE_DIR somewhere else",
                )
            return 0
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def _migrate(self) -> int:
        with self._tx() as conn:
            version = self._read_version(conn)
            if version > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"session database {self.path} has schema version {version}; "
                    f"this sandforge understands up to {SCHEMA_VERSION}",
                    hint="upgrade sandforge, or use another state directory",
                )
            if version == SCHEMA_VERSION:
                return version
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            for v in range(version, SCHEMA_VERSION):
                log.info("session database %s: migrating schema %d -> %d", self.path, v, v + 1)
                MIGRATIONS[v](conn)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            return SCHEMA_VERSION

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sessions ---------------------------------------------------------------------------------------

    def create_session(self, *, title: str = "", cleared_from: str | None = None) -> SessionInfo:
        now = time.time()
        session_id = uuid.uuid4().hex[:16]
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO sessions (id, title, created_at, updated_at, cleared_from) VALUES (?, ?, ?, ?, ?)",
                (session_id, title[:TITLE_MAX], now, now, cleared_from),
            )
        return SessionInfo(
            id=session_id, title=title[:TITLE_MAX], created_at=now, updated_at=now, cleared_from=cleared_from
        )

    _SESSION_SELECT = (
        "SELECT s.id, s.title, s.created_at, s.updated_at, s.cleared_from,"
        " (SELECT count(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s"
    )

    @staticmethod
    def _info(row: tuple[Any, ...]) -> SessionInfo:
        return SessionInfo(
            id=row[0],
            title=row[1] or "",
            created_at=row[2],
            updated_at=row[3],
            cleared_from=row[4],
            message_count=row[5],
        )

    def resolve_id(self, session_id: str) -> str:
        """An exact id, or a prefix matching exactly one session."""
        if not session_id:
            raise SessionNotFoundError("empty session id")
        if self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)):
            return session_id
        escaped = session_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query("SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' LIMIT 2", (escaped + "%",))
        if len(rows) == 1:
            return str(rows[0][0])
        if not rows:
            raise SessionNotFoundError(
                f"no session {session_id!r} in {self.path}", hint="`sandforge sessions list` shows them"
            )
        raise SessionNotFoundError(f"session id prefix {session_id!r} is ambiguous", hint="give more characters")

    def get_session(self, session_id: str) -> SessionInfo:
        resolved = self.resolve_id(session_id)
        rows = self._query(self._SESSION_SELECT + " WHERE s.id = ?", (resolved,))
        if not rows:  # deleted in between
            raise SessionNotFoundError(f"no session {session_id!r} in {self.path}")
        return self._info(rows[0])

    def list_sessions(self, *, limit: int | None = None) -> list[SessionInfo]:
        sql = self._SESSION_SELECT + " ORDER BY s.updated_at DESC, s.id"
        params: tuple[Any, ...] = ()
        if limit is not None:
            sql += " LIMIT ?"
            params = (limit,)
        return [self._info(r) for r in self._query(sql, params)]

    def page_sessions(self, *, limit: int, after: str | None = None) -> list[SessionInfo]:
        """At most ``limit`` sessions, newest created first, starting after the session ``after`` (an exact
        id; SessionNotFoundError otherwise). Pages by creation, not by update: sessions created or used while a
        client pages through them never shift a later page (``GET /v1/sessions``)."""
        sql, params = self._SESSION_SELECT, []
        if after is not None:
            rows = self._query("SELECT created_at, id FROM sessions WHERE id = ?", (after,))
            if not rows:
                raise SessionNotFoundError(f"no session {after!r} in {self.path}")
            sql += " WHERE (s.created_at, s.id) < (?, ?)"
            params = list(rows[0])
        sql += " ORDER BY s.created_at DESC, s.id DESC LIMIT ?"
        return [self._info(r) for r in self._query(sql, (*params, limit))]

    # --- messages ---------------------------------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> list[Message]:
        """Persist ``messages`` (one session) in one transaction; returns them with ids and timestamps."""
        if not messages:
            return []
        session_ids = {m.session_id for m in messages}
        if len(session_ids) != 1:
            raise ValueError("append() takes the messages of one session at a time")
        (session_id,) = session_ids
        now = time.time()
        stored: list[Message] = []
        with self._tx() as conn:
            row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFoundError(f"no session {session_id!r} in {self.path}")
            title = row[0] or ""
            for m in messages:
                cur = conn.execute(
                    _INSERT_MESSAGE,
                    (
                        session_id,
                        m.type.value,
                        m.content,
                        m.tool_name,
                        m.tool_call_id,
                        m.tool_status.value if m.tool_status else None,
                        m.tool_input,
                        now,
                        json.dumps(m.metadata, ensure_ascii=False, default=str) if m.metadata else None,
                    ),
                )
                stored.append(m.model_copy(update={"id": cur.lastrowid, "created_at": now}))
                if not title and m.type is MessageType.USER and m.content.strip():
                    title = m.content.strip().splitlines()[0][:TITLE_MAX]
            conn.execute("UPDATE sessions SET updated_at = ?, title = ? WHERE id = ?", (now, title, session_id))
        return stored

    def messages(self, session_id: str) -> list[Message]:
        """The session's history, oldest first (a snapshot; one query)."""
        with gc_paused():  # thousands of rows form no cycles: collections would find nothing
            return _rows_to_messages(self._query(_SELECT_MESSAGES, (session_id,)))
