"""The state database: a tenant's committed contexts and its committed calls' records, in one SQLite file.

Layout (schema version 1)::

    schema_version(version)                         one row
    contexts(role, version, body, updated_at)       body: the context as one JSON object
    call_records(call_id, trace_id, role, method, status, committed_at, record, logged, owner)

A top-level attempt's commit is one ``BEGIN IMMEDIATE`` transaction: the versions of the contexts it writes
are checked against those it read (a change underneath is refused: ``CommitConflict``, the call runs again),
then its contexts and the records of its calls (its own and its nested calls') are written together, so
after a crash either both are there or neither is. ``synchronous = FULL``: a commit is on disk before the
call is answered. Several processes (``serve`` and ``mcp`` on one tenant) share the file: writers queue on
SQLite's lock, and each process notices the others' commits by ``PRAGMA data_version`` (``changed``).

``calls.jsonl`` (the call log readers use) is appended after the commit; a record whose line a crash lost is
still here (``logged = 0``) and is appended by the next process that opens the database
(:meth:`StateDB.unlogged`), unless the process that committed it is still running; ``Workspace`` looks for
its line at the log's end first, so a record whose line was written is not written twice.

``call_records`` is bounded (``call_records_max``, ``$SANDFORGE_CALL_RECORDS_MAX``): the commit that takes the
table over it deletes, in its own transaction, its oldest records (insertion order) that ``calls.jsonl`` already
holds. A record not yet in the log (``logged = 0``) is never pruned: it is what a crash recovery appends, so
the bound holds once the log has caught up. ``calls.jsonl`` is the history; this table is the commit's
guarantee, and needs no more than the recent records (no reader pages through it: ``record`` looks one up by
id, ``unlogged`` reads only what pruning keeps).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.sqlite import enable_wal, immediate, is_busy, private_db_file
from sandforge.sandbox.context import ContextError, ContextSnapshot

DB_FILE_NAME = "state.db"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
#: Committed call records kept (the newest); the environment variable overrides it (``sandforge config``).
CALL_RECORDS_MAX = 100_000
CALL_RECORDS_MAX_ENV = "SANDFORGE_CALL_RECORDS_MAX"


def call_records_max() -> int:
    """The configured bound: ``$SANDFORGE_CALL_RECORDS_MAX`` (a whole number, at least 1), else the default."""
    text = os.environ.get(CALL_RECORDS_MAX_ENV, "").strip()
    if not text:
        return CALL_RECORDS_MAX
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise StateDBError(f"{CALL_RECORDS_MAX_ENV}={text!r} is not a whole number of at least 1")
    return value


class StateDBError(SandforgeError):
    """The state database cannot be opened or written (corrupt, busy past the timeout, disk full)."""


@dataclass(frozen=True)
class Committed:
    """One role's committed context and the number of commits that made it (0: never written)."""

    version: int
    snapshot: ContextSnapshot

    @property
    def etag(self) -> str:
        """A strong entity tag: the version and a hash of the content (a recreated database cannot repeat one)."""
        digest = hashlib.sha256(encode_body(self.snapshot)).hexdigest()[:16]
        return f'"{self.version}-{digest}"'


def encode_body(snapshot: Mapping[str, bytes]) -> bytes:
    """A context as one JSON object, each key's text as it is (nothing re-encoded)."""
    parts = [json.dumps(key).encode("utf-8") + b":" + text for key, text in snapshot.items()]
    return b"{" + b",".join(parts) + b"}"


def decode_body(body: str | bytes, role: str) -> ContextSnapshot:
    try:
        return ContextSnapshot.from_dict(json.loads(body))
    except (ValueError, ContextError) as exc:
        raise StateDBError(f"the stored context of {role!r} is not a JSON object: {exc}") from None


def _migrate_v0(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute(
        "CREATE TABLE contexts (role TEXT PRIMARY KEY, version INTEGER NOT NULL, body TEXT NOT NULL,"
        " updated_at TEXT NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE call_records (call_id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, role TEXT NOT NULL,"
        " method TEXT NOT NULL, status TEXT NOT NULL, committed_at TEXT NOT NULL, record TEXT NOT NULL,"
        " logged INTEGER NOT NULL DEFAULT 0, owner INTEGER NOT NULL)"
    )
    conn.execute("CREATE INDEX call_records_unlogged ON call_records (logged) WHERE logged = 0")
    conn.execute("INSERT INTO schema_version VALUES (1)")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StateDB:
    """One tenant's state database. Thread-safe (one connection behind a lock); safe across processes."""

    def __init__(self, path: Path, *, max_call_records: int | None = None) -> None:
        self.path = path
        self.max_call_records = call_records_max() if max_call_records is None else max_call_records
        if self.max_call_records < 1:
            raise StateDBError(f"max_call_records must be at least 1, not {self.max_call_records}")
        self._lock = threading.RLock()

        def refuse(kind: str) -> StateDBError:
            return StateDBError(f"state database {path} is {kind}, not a regular file; refused")

        try:
            private_db_file(path, refuse)
            self._conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StateDBError(f"cannot open state database {path}: {exc}") from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            enable_wal(self._conn, BUSY_TIMEOUT_S)
            self._conn.execute("PRAGMA synchronous = FULL")  # answered means on disk
            with self._tx() as conn:
                known = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone()
                version = conn.execute("SELECT version FROM schema_version").fetchone()[0] if known else 0
                if version > SCHEMA_VERSION:
                    raise StateDBError(
                        f"state database {path} has schema version {version}; this sandforge reads up to "
                        f"{SCHEMA_VERSION}", hint="upgrade sandforge",
                    )  # fmt: skip
                if version == 0:
                    _migrate_v0(conn)
            self._data_version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc) from None
        except BaseException:
            self._conn.close()
            raise

    # --- plumbing ---

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``runtime.files.sqlite.immediate``); sqlite errors become StateDBError."""
        return immediate(self._conn, self._lock, self._error)

    def _error(self, exc: sqlite3.Error) -> StateDBError:
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            hint = "restore it from a backup, or move it aside (its contexts are then gone)"
            return StateDBError(f"state database {self.path} is corrupt: {text}", hint=hint)
        why = "busy (another process holds its write lock)" if is_busy(exc) else text
        return StateDBError(f"state database {self.path}: {why}")

    def changed(self) -> bool:
        """Whether another connection (another process) committed since this one last looked."""
        with self._lock:
            try:
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error as exc:
                raise StateDBError(f"state database {self.path}: {exc}") from None
            changed: bool = version != self._data_version
            self._data_version = version
            return changed

    # --- contexts ---

    def read(self, role: str) -> Committed:
        with self._lock:
            try:
                row = self._conn.execute("SELECT version, body FROM contexts WHERE role = ?", (role,)).fetchone()
            except sqlite3.Error as exc:
                raise StateDBError(f"state database {self.path}: {exc}") from None
        if row is None:
            return Committed(0, ContextSnapshot())
        return Committed(int(row[0]), decode_body(row[1], role))

    def commit(
        self,
        contexts: Mapping[str, ContextSnapshot],
        bases: Mapping[str, int] | None,
        records: Iterable[tuple[str, str, str, str, str, str]] = (),
    ) -> tuple[list[str], dict[str, int]]:
        """Write ``contexts`` and ``records`` in one transaction: ``(conflicts, new versions)``.

        ``bases``: the version each written role had when it was read; a role committed since (or, with
        ``bases`` None, nothing) is a conflict, and then nothing is written. ``records``: (call_id, trace_id,
        role, method, status, record JSON)."""
        now = datetime.now(UTC).isoformat()
        rows = [(*r[:5], now, r[5], os.getpid()) for r in records]
        with self._tx() as conn:
            current = {role: self._version(conn, role) for role in contexts}
            if bases is not None:
                conflicts = [r for r in contexts if r in bases and current[r] != bases[r]]
                if conflicts:
                    return conflicts, {}
            versions = {role: current[role] + 1 for role in contexts}
            conn.executemany(
                "INSERT INTO contexts (role, version, body, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (role)"
                " DO UPDATE SET version = excluded.version, body = excluded.body, updated_at = excluded.updated_at",
                [(role, versions[role], encode_body(snap).decode("utf-8"), now) for role, snap in contexts.items()],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO call_records (call_id, trace_id, role, method, status, committed_at, record,"
                " logged, owner) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                rows,
            )
            if rows:
                self._prune(conn)
        return [], versions

    def replace(self, role: str, snapshot: ContextSnapshot, if_match: str | None) -> tuple[Committed, bool]:
        """Set ``role``'s context unless ``if_match`` (an entity tag, ``*`` matches any) is not its current
        one: ``(the context now, written)``; nothing is written when it does not match."""
        with self._tx() as conn:
            row = conn.execute("SELECT version, body FROM contexts WHERE role = ?", (role,)).fetchone()
            now = Committed(0, ContextSnapshot()) if row is None else Committed(int(row[0]), decode_body(row[1], role))
            if if_match is not None and if_match.strip() != "*" and now.etag not in etags(if_match):
                return now, False
            version = now.version + 1
            conn.execute(
                "INSERT INTO contexts (role, version, body, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (role)"
                " DO UPDATE SET version = excluded.version, body = excluded.body, updated_at = excluded.updated_at",
                (role, version, encode_body(snapshot).decode("utf-8"), datetime.now(UTC).isoformat()),
            )
        return Committed(version, snapshot), True

    @staticmethod
    def _version(conn: sqlite3.Connection, role: str) -> int:
        row = conn.execute("SELECT version FROM contexts WHERE role = ?", (role,)).fetchone()
        return 0 if row is None else int(row[0])

    # --- records ---

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Inside a commit's transaction (writers queue on SQLite's lock, so two never prune at once): the
        oldest logged records beyond the bound. Rowids grow with each insert (a replaced record is a new row),
        so rowid order is commit order."""
        excess = int(conn.execute("SELECT count(*) FROM call_records").fetchone()[0]) - self.max_call_records
        if excess > 0:
            conn.execute(
                "DELETE FROM call_records WHERE rowid IN"
                " (SELECT rowid FROM call_records WHERE logged = 1 ORDER BY rowid LIMIT ?)", (excess,)
            )  # fmt: skip

    def logged(self, call_ids: list[str], records: list[str] | None = None) -> None:
        """These records are in ``calls.jsonl`` now (``records``: their final JSON, the store's fields added).
        Not fsynced on its own: a power cut may forget it, and the line is then written a second time."""
        if not call_ids:
            return
        rows = [(records[i] if records else None, cid) for i, cid in enumerate(call_ids)]
        with self._lock:
            self._conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self._tx() as conn:
                    conn.executemany(
                        "UPDATE call_records SET logged = 1, record = coalesce(?, record) WHERE call_id = ?", rows
                    )
            finally:
                self._conn.execute("PRAGMA synchronous = FULL")

    def unlogged(self) -> list[tuple[str, str]]:
        """(call_id, record JSON) of committed records missing from ``calls.jsonl`` whose process is gone."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT call_id, record, owner FROM call_records WHERE logged = 0 ORDER BY committed_at"
                ).fetchall()
            except sqlite3.Error as exc:
                raise StateDBError(f"state database {self.path}: {exc}") from None
        return [(str(r[0]), str(r[1])) for r in rows if not _alive(int(r[2]))]

    def record(self, call_id: str) -> str | None:
        """The committed record of ``call_id`` (JSON), if there is one."""
        with self._lock:
            row = self._conn.execute("SELECT record FROM call_records WHERE call_id = ?", (call_id,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def etags(header: str) -> list[str]:
    """The entity tags of an ``If-Match`` list (weak ones never match: RFC 9110 uses strong comparison)."""
    return [t.strip() for t in header.split(",") if t.strip() and not t.strip().startswith("W/")]
