"""A SQLite index over a tenant's call log (JSONL), so the dashboard pages stay fast at a million records.

The log stays the record: the index holds, per line, its byte offset and length plus the fields the pages filter
and count on (time, role, method, status, failure stage, error type, trace, call ids, how many security events,
the call's source: agent or a cli/http/mcp run), one row per security event (issue 36: time, source, event,
attempt; the security page and its filters), and per hour the number of calls and failures by error type (the
overview's chart and counts). Only bytes appended since the last commit are ever indexed; a log that shrank or
was replaced (another inode) is indexed again from the start. A short tail is indexed by the read that finds it;
a long one (a large existing log, met for the first time) by a background thread while the pages answer with what
is indexed so far (:class:`Progress`). Every batch commits its rows with the offset it reached, so a build that
dies resumes where it stopped, and one process's batch never repeats another's. Pages read a record by seeking to
its offset, so a page costs one indexed query and a few short reads whatever the log's size. The index file lives
beside the log, in the tenant's own state directory, created 0600.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sandforge.runtime.agent.calllog import CallRecord, parse_record

log = logging.getLogger(__name__)

#: a call record is bounded; a longer line is not one and is skipped unread (as ``sandforge logs`` does)
MAX_LINE_BYTES = 4 * 1024 * 1024
#: lines indexed per transaction while catching up
BATCH = 5000
#: 2: security events (a version change rebuilds the index from the log, tables and all); 3: answered errors;
#: 4: the call's source (issue 37: runs of cli, http, mcp beside agent calls)
INDEX_VERSION = 4
#: a tail at most this long is indexed by the read that finds it (a page shows every call that returned);
#: a longer one in the background
INLINE_BYTES = 4 * 1024 * 1024
#: the writer's page cache (KiB; SQLite's default is 2 MB): a build of 1,000,000 records ~20% faster
WRITER_CACHE_KIB = 32 * 1024
#: the longest a build waits for the pages being built before it goes on (it must finish some day)
READER_PAUSE_S = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY, off INTEGER NOT NULL, len INTEGER NOT NULL, t REAL NOT NULL,
    role TEXT NOT NULL, method TEXT NOT NULL, status TEXT NOT NULL, error_type TEXT, stage TEXT,
    failure_class TEXT, trace TEXT NOT NULL, call_id TEXT NOT NULL, parent TEXT, depth INTEGER NOT NULL,
    duration REAL NOT NULL, attempts INTEGER NOT NULL, security INTEGER NOT NULL DEFAULT 0,
    answered INTEGER NOT NULL DEFAULT 0, source TEXT NOT NULL DEFAULT 'agent'
);
CREATE INDEX IF NOT EXISTS calls_t ON calls (t);
CREATE INDEX IF NOT EXISTS calls_role ON calls (role, method, id);
CREATE INDEX IF NOT EXISTS calls_status ON calls (status, id);
CREATE INDEX IF NOT EXISTS calls_role_status ON calls (role, status, id);
CREATE INDEX IF NOT EXISTS calls_stage ON calls (stage, id);
CREATE INDEX IF NOT EXISTS calls_call_id ON calls (call_id);
CREATE INDEX IF NOT EXISTS calls_parent ON calls (parent);
CREATE INDEX IF NOT EXISTS calls_trace ON calls (trace);
CREATE INDEX IF NOT EXISTS calls_security ON calls (id) WHERE security > 0;
CREATE INDEX IF NOT EXISTS calls_source ON calls (source, id);
CREATE TABLE IF NOT EXISTS security (
    id INTEGER PRIMARY KEY, call INTEGER NOT NULL, n INTEGER NOT NULL, t REAL NOT NULL, source TEXT NOT NULL,
    event TEXT NOT NULL, attempt INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS security_source ON security (source, event, id);
CREATE TABLE IF NOT EXISTS hours (
    hour INTEGER NOT NULL, error_type TEXT NOT NULL, answered INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (hour, error_type, answered)
) WITHOUT ROWID;
"""
#: what an index of another version holds is dropped before the current schema is made (then rebuilt)
_DROP = "DROP TABLE IF EXISTS calls; DROP TABLE IF EXISTS hours; DROP TABLE IF EXISTS security; DELETE FROM meta;"


@dataclass(frozen=True)
class CallFilter:
    """The call list's filters; every one given must hold. ``before``: keyset paging (ids below it)."""

    role: str | None = None
    method: str | None = None
    status: str | None = None
    stage: str | None = None
    since: float | None = None
    until: float | None = None
    trace: str | None = None
    before: int | None = None
    #: only calls that had a security event (issue 36)
    security: bool = False
    #: only calls of this source (``CallSource``: agent, cli, http, mcp, framework)
    source: str | None = None

    def index(self) -> str:
        """The index to walk, most selective filter first (the planner, without statistics, may pick the
        status index and scan every failure for a role that has a handful)."""
        if self.trace is not None:
            return "INDEXED BY calls_trace"
        if self.role is not None:
            return "INDEXED BY calls_role_status" if self.method is None and self.status else "INDEXED BY calls_role"
        if self.security:
            return "INDEXED BY calls_security"  # few calls have one: the partial index holds only those
        if self.source is not None:
            return "INDEXED BY calls_source"
        if self.stage is not None and self.stage != "none":
            return "INDEXED BY calls_stage"
        if self.status is not None:
            return "INDEXED BY calls_status"
        if self.since is not None:
            return "INDEXED BY calls_t"  # the rows since then, sorted: recent windows are small
        return "NOT INDEXED"  # newest first by id: stops after one page

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("role", self.role), ("method", self.method), ("status", self.status),
                              ("source", self.source)):  # fmt: skip
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.stage is not None:
            clauses.append("stage IS NULL" if self.stage == "none" else "stage = ?")
            params += [] if self.stage == "none" else [self.stage]
        bounds: tuple[tuple[str, float | int | None], ...] = (
            ("t >= ?", self.since), ("t < ?", self.until), ("id < ?", self.before)
        )  # fmt: skip
        for clause, bound in bounds:
            if bound is not None:
                clauses.append(clause)
                params.append(bound)
        if self.trace is not None:
            clauses.append("trace = ?")
            params.append(self.trace)
        if self.security:
            clauses.append("security > 0")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


@dataclass(frozen=True)
class IndexedCall:
    """One record's row: its place in the log and its indexed fields."""

    id: int
    off: int
    len: int
    t: float
    role: str
    method: str
    status: str
    error_type: str | None
    stage: str | None
    failure_class: str | None
    trace: str
    call_id: str
    parent: str | None
    depth: int
    duration: float
    attempts: int
    security: int = 0
    #: 1: the error is the program's own ``Outcome.error``, its answer (not a failure: see :func:`answered`)
    answered: int = 0
    #: who asked: agent, or a run's cli, http, mcp (``CallRecord.source``)
    source: str = "agent"


_COLUMNS = "id, off, len, t, role, method, status, error_type, stage, failure_class, trace, call_id, parent, depth, " \
    "duration, attempts, security, answered, source"


def answered(data: dict[str, Any]) -> bool:
    """Whether a failed call's record is an answer, not a failure (ADR 0012, issue 37): the program's own
    ``Outcome.error`` (``tool_error``), unless the host saw its cause (then ``failure_class`` is extrinsic)."""
    return data.get("status") == "error" and bool(data.get("tool_error")) and data.get("failure_class") != "extrinsic"


@dataclass(frozen=True)
class SecurityFilter:
    """The security page's filters; every one given must hold. ``before``: keyset paging (event ids below it)."""

    source: str | None = None
    event: str | None = None
    since: float | None = None
    before: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        given = [(clause, value) for clause, value in (("s.source = ?", self.source), ("s.event = ?", self.event),
                 ("s.t >= ?", self.since), ("s.id < ?", self.before)) if value is not None]  # fmt: skip
        return (" WHERE " + " AND ".join(c for c, _ in given)) if given else "", [v for _, v in given]


@dataclass(frozen=True)
class IndexedSecurityEvent:
    """One security event's row: which entry of which call's ``security_events`` it is, and its indexed fields."""

    id: int
    n: int
    t: float
    source: str
    event: str
    attempt: int
    call: IndexedCall


#: one security event as indexed: (time, source, event, attempt number)
EventRow = tuple[float, str, str, int]


def _events(data: dict[str, Any], started: float) -> list[EventRow]:
    """The indexed fields of a record's ``security_events`` (an entry without a readable time takes the call's)."""
    found: list[EventRow] = []
    for entry in data.get("security_events") or []:
        try:
            t = datetime.fromisoformat(str(entry["timestamp"])).timestamp()
        except (ValueError, KeyError, TypeError):
            t = started
        found.append((t, str(entry["source"]), str(entry["event"]), int(entry.get("attempt_number", 0))))
    return found


def _row(line: bytes, off: int) -> tuple[tuple[Any, ...], list[EventRow]] | None:
    """The indexed fields of one log line and of its security events, or None when it is not a current call
    record (skipped, as the readers of the log skip it). Full validation is left to the page that shows it."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("schema_version") != 1:
            return None
        started = datetime.fromisoformat(str(data["started_at"])).timestamp()
        row = (
            off, len(line), started, str(data["role"]), str(data["method"]), str(data["status"]),
            data.get("error_type"), data.get("latest_failure_stage") if data["status"] == "error" else None,
            data.get("failure_class"), str(data["trace_id"]), str(data["call_id"]), data.get("parent_call_id"),
            int(data.get("depth", 0)), float(data.get("duration_s", 0.0)), int(data.get("attempts", 0)),
        )  # fmt: skip
        events = _events(data, started)
    except (ValueError, KeyError, TypeError):
        return None
    return (*row, len(events), int(answered(data)), str(data.get("source") or "agent")), events


@dataclass(frozen=True)
class Progress:
    """How far the index is behind its log: what the pages say while a build runs."""

    indexed_records: int
    indexed_bytes: int
    log_bytes: int
    building: bool

    @property
    def estimated_records(self) -> int:
        """The records in the whole log, estimated from the mean length of those indexed so far."""
        if self.indexed_bytes <= 0 or self.indexed_records <= 0:
            return self.indexed_records
        return max(self.indexed_records, round(self.indexed_records * self.log_bytes / self.indexed_bytes))


class CallIndex:
    """The index of one call log (see the module docstring). Thread-safe.

    Readers and the writer have a connection each (WAL: a reader sees every committed batch, never waits for
    the writer). A read first brings the index up to date when little was appended (at most ``inline_bytes``,
    under the writer's lock, which is never held longer than one batch); a longer tail (a large log met for
    the first time, a log that grew while no page looked) is indexed by a background thread, batch by batch,
    each batch committed with the offset it reached: pages answer at once with what is indexed so far and
    :meth:`progress`, and a build that dies (the process killed) resumes from its last commit.
    """

    def __init__(self, log_path: Path, index_path: Path | None = None, *, inline_bytes: int | None = None) -> None:
        self.log_path = log_path
        self.index_path = index_path if index_path is not None else log_path.with_suffix(".index.sqlite")
        self.inline_bytes = INLINE_BYTES if inline_bytes is None else inline_bytes
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()  # held for one batch at most
        self._start_lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._writer: sqlite3.Connection | None = None
        self._builder: threading.Thread | None = None
        self._stop = threading.Event()
        self._log_bytes = 0
        self._readers = 0  # pages being built now: the build steps aside for them (one GIL for both)
        self.pauses = 0  # how often it did
        self._idle = threading.Condition()

    def _open(self) -> sqlite3.Connection:
        self.index_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        db = sqlite3.connect(self.index_path, check_same_thread=False, isolation_level=None, timeout=30.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _write_db(self) -> sqlite3.Connection:
        """The writer's connection (call with the writer's lock held)."""
        if self._writer is None:
            db = self._open()
            db.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")  # the indexes' pages stay in memory while building
            if self._other_version(db):
                db.executescript(_DROP)
            db.executescript(_SCHEMA)
            self._writer = db
        return self._writer

    @staticmethod
    def _other_version(db: sqlite3.Connection) -> bool:
        """Whether the file holds an index of another version (its tables may lack columns this one has)."""
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
            return False
        row = db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return row is not None and row[0] != str(INDEX_VERSION)

    def _read_db(self) -> sqlite3.Connection:
        """The readers' connection (call with the readers' lock held); the schema exists once it is open."""
        if self._reader is None:
            with self._write_lock:
                self._write_db()
            self._reader = self._open()
        return self._reader

    @contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        self._refresh()
        with self._read_lock:
            yield self._read_db()

    def close(self) -> None:
        """Stop a running build (after its current batch; the next process resumes it) and close."""
        self._stop.set()
        builder = self._builder
        if builder is not None:
            builder.join()
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self._stop.clear()

    # --- keeping up with the log -----------------------------------------------------------------------

    @staticmethod
    def _meta(db: sqlite3.Connection) -> dict[str, str]:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())

    def _log_stat(self) -> os.stat_result | None:
        try:
            fd = os.open(self.log_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return st if stat.S_ISREG(st.st_mode) else None

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A page is being built: a running build pauses between lines (at most READER_PAUSE_S at a time) so
        the page's Python work does not share the interpreter with the build's parsing."""
        with self._idle:
            self._readers += 1
        try:
            yield
        finally:
            with self._idle:
                self._readers -= 1
                if not self._readers:
                    self._idle.notify_all()

    def _step_aside(self) -> bool:
        """Wait while pages are being built; False when they took longer than READER_PAUSE_S."""
        with self._idle:
            self.pauses += 1
            return self._idle.wait_for(lambda: not self._readers, READER_PAUSE_S)

    def building(self) -> bool:
        builder = self._builder
        return builder is not None and builder.is_alive()

    def _refresh(self) -> None:
        """Index what was appended: inline when it is short, else in the background (never waited for)."""
        st = self._log_stat()
        if st is None:
            return
        self._log_bytes = st.st_size
        if self.building():
            return
        with self._read_lock:
            meta = self._meta(self._read_db())
        offset = int(meta.get("offset", "0"))
        same = meta.get("identity") == f"{st.st_dev}:{st.st_ino}" and meta.get("version") == str(INDEX_VERSION)
        if same and st.st_size == offset:
            return
        if st.st_size - (offset if same and offset <= st.st_size else 0) <= self.inline_bytes:
            with self._write_lock:
                self._catch_up(self._write_db(), end=st.st_size)
            return
        self._start_build()

    def _start_build(self) -> None:
        with self._start_lock:
            if self.building() or self._stop.is_set():
                return
            self._builder = threading.Thread(target=self._build, name=f"call-index {self.log_path.name}", daemon=True)
            self._builder.start()

    def _build(self) -> None:
        try:
            while not self._stop.is_set():
                with self._write_lock:
                    more = self._catch_up(self._write_db(), end=None, max_rows=BATCH)
                if not more:
                    with self._write_lock:
                        self._write_db().execute("PRAGMA shrink_memory")  # the cache back, till the next build
                    return
        except Exception:  # the pages go on with what is indexed; the next read starts a build again
            log.exception("indexing %s failed", self.log_path)

    def _reset(self, db: sqlite3.Connection, identity: str) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM calls")
        db.execute("DELETE FROM hours")
        db.execute("DELETE FROM security")
        db.execute("DELETE FROM meta")
        db.executemany("INSERT INTO meta VALUES (?, ?)",
                       [("version", str(INDEX_VERSION)), ("identity", identity), ("offset", "0")])  # fmt: skip
        db.execute("COMMIT")

    def _catch_up(self, db: sqlite3.Connection, *, end: int | None, max_rows: int | None = None) -> bool:
        """Index from the committed offset up to ``end`` (None: the log's end), ``max_rows`` records at most.
        True when a batch was cut short by ``max_rows`` (more to do)."""
        try:
            fd = os.open(self.log_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return False
            self._log_bytes = st.st_size
            identity = f"{st.st_dev}:{st.st_ino}"
            meta = self._meta(db)
            offset = int(meta.get("offset", "0"))
            if meta.get("identity") != identity or meta.get("version") != str(INDEX_VERSION) or st.st_size < offset:
                self._reset(db, identity)
                offset = 0
            stop = st.st_size if end is None else min(end, st.st_size)
            if stop <= offset:
                return False
            fh.seek(offset)
            return self._index_from(db, fh, offset, stop, max_rows)

    def _index_from(self, db: sqlite3.Connection, fh: Any, offset: int, stop: int, max_rows: int | None) -> bool:
        start = offset
        rows: list[tuple[tuple[Any, ...], list[EventRow]]] = []
        lines, next_pause = 0, 0
        while offset < stop:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if len(line) > MAX_LINE_BYTES:  # not a record: skipped unread, in bounded pieces, up to its end
                skipped = self._skip_line(fh, len(line))
                if skipped is None:
                    break  # still being written: looked at again on a later read
                offset += skipped
                continue
            if not line or not line.endswith(b"\n"):
                break  # the end, or a line still being written: indexed on a later read
            row = _row(line, offset)
            if row is not None:
                rows.append(row)
            offset += len(line)
            lines += 1
            if self._readers and lines >= next_pause and threading.current_thread() is self._builder:
                next_pause = lines + (64 if self._step_aside() else 4096)  # pages that take long: go on a while
            if max_rows is not None and len(rows) >= max_rows:
                return self._commit(db, rows, start, offset) and offset < stop
            if len(rows) >= BATCH:
                if not self._commit(db, rows, start, offset):
                    return False
                start, rows = offset, []
        self._commit(db, rows, start, offset)
        return False

    @staticmethod
    def _skip_line(fh: Any, seen: int) -> int | None:
        """The length of the over-long line being read (its first ``seen`` bytes read), or None at the end of
        the file before its newline."""
        while True:
            piece = fh.readline(MAX_LINE_BYTES)
            if not piece:
                return None
            seen += len(piece)
            if piece.endswith(b"\n"):
                return seen

    @staticmethod
    def _commit(db: sqlite3.Connection, rows: list[tuple[tuple[Any, ...], list[EventRow]]], start: int, offset: int,
                ) -> bool:  # fmt: skip
        """Add ``rows`` (the log's bytes ``start`` to ``offset``) and the new offset in one transaction: a crash
        keeps both or neither. False (nothing written) when another process moved the offset meanwhile."""
        if offset == start:
            return True
        hours: dict[tuple[int, str, int], int] = {}
        for r, _ in rows:
            key = (int(r[2] // 3600), "" if r[5] == "ok" else (r[6] or "error"), r[16])
            hours[key] = hours.get(key, 0) + 1
        db.execute("BEGIN IMMEDIATE")
        try:
            current = db.execute("SELECT value FROM meta WHERE key = 'offset'").fetchone()
            if current is None or int(current[0]) != start:
                db.execute("ROLLBACK")
                return False
            # ids are given by the index, not left to SQLite: a call's security events name the call's id
            first = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM calls").fetchone()[0]) + 1
            db.executemany(
                "INSERT INTO calls (id, off, len, t, role, method, status, error_type, stage, failure_class, trace, "
                "call_id, parent, depth, duration, attempts, security, answered, source) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(first + i, *r) for i, (r, _) in enumerate(rows)],
            )
            db.executemany(
                "INSERT INTO security (call, n, t, source, event, attempt) VALUES (?, ?, ?, ?, ?, ?)",
                [(first + i, n, *e) for i, (_, events) in enumerate(rows) for n, e in enumerate(events)],
            )
            db.executemany(
                "INSERT INTO hours VALUES (?, ?, ?, ?) ON CONFLICT (hour, error_type, answered) "
                "DO UPDATE SET n = n + excluded.n",
                [(h, e, a, n) for (h, e, a), n in hours.items()],
            )
            db.execute("UPDATE meta SET value = ? WHERE key = 'offset'", (str(offset),))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return True

    def progress(self) -> Progress:
        """Records and bytes indexed, the log's size, and whether a build is running now."""
        self._refresh()
        with self._read_lock:
            db = self._read_db()
            meta = self._meta(db)
            records = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM calls").fetchone()[0])
        return Progress(records, int(meta.get("offset", "0")), self._log_bytes, self.building())

    # --- queries ---------------------------------------------------------------------------------------

    def page(self, flt: CallFilter, limit: int) -> list[IndexedCall]:
        """The newest ``limit`` calls matching ``flt`` (below ``flt.before``), newest first."""
        where, params = flt.where()
        with self._session() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM calls {flt.index()}{where} ORDER BY id DESC LIMIT ?",  # noqa: S608
                              [*params, limit]).fetchall()  # fmt: skip
        return [IndexedCall(*r) for r in rows]

    def security_events(self, flt: SecurityFilter, limit: int) -> list[IndexedSecurityEvent]:
        """The newest ``limit`` security events matching ``flt`` (below ``flt.before``), newest first, each
        with its call's row."""
        where, params = flt.where()
        columns = ", ".join(f"c.{c.strip()}" for c in _COLUMNS.split(","))
        index = "INDEXED BY security_source " if flt.source is not None else ""
        with self._session() as db:
            rows = db.execute(f"SELECT s.id, s.n, s.t, s.source, s.event, s.attempt, {columns} FROM security s "  # noqa: S608
                              f"{index}JOIN calls c ON c.id = s.call{where} ORDER BY s.id DESC LIMIT ?",
                              [*params, limit]).fetchall()  # fmt: skip
        return [IndexedSecurityEvent(r[0], r[1], r[2], r[3], r[4], r[5], IndexedCall(*r[6:])) for r in rows]

    def security_total(self) -> int:
        with self._session() as db:
            return int(db.execute("SELECT COUNT(*) FROM security").fetchone()[0])

    def find(self, call_id: str) -> IndexedCall | None:
        with self._session() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM calls WHERE call_id = ? ORDER BY id DESC LIMIT 1",  # noqa: S608
                             (call_id,)).fetchone()  # fmt: skip
        return IndexedCall(*row) if row else None

    def trace(self, trace_id: str, limit: int = 500) -> list[IndexedCall]:
        """Every call of one trace (a top-level call and its nested calls), in log order."""
        with self._session() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM calls WHERE trace = ? ORDER BY id LIMIT ?",  # noqa: S608
                              (trace_id, limit)).fetchall()  # fmt: skip
        return [IndexedCall(*r) for r in rows]

    def count_since(self, since: float) -> tuple[int, int, int]:
        """(calls, failures, answered with error) started at or after ``since``; answers are not failures."""
        with self._session() as db:
            row = db.execute("SELECT COUNT(*), COALESCE(SUM(status = 'error' AND answered = 0), 0), "
                             "COALESCE(SUM(answered), 0) FROM calls WHERE t >= ?", (since,)).fetchone()  # fmt: skip
        return int(row[0]), int(row[1]), int(row[2])

    def hourly(self, first_hour: int) -> list[tuple[int, str, bool, int]]:
        """(hour, error_type or '' for successes, answered with error, count) for every hour from ``first_hour``."""
        with self._session() as db:
            rows = db.execute("SELECT hour, error_type, answered, n FROM hours WHERE hour >= ? ORDER BY hour",
                              (first_hour,)).fetchall()  # fmt: skip
        return [(int(h), str(e), bool(a), int(n)) for h, e, a, n in rows]

    def values(self, column: str, limit: int = 200) -> list[str]:
        """Distinct values of ``role`` or ``method`` (the filter choices), at most ``limit``."""
        if column not in {"role", "method"}:
            raise ValueError(f"not a filter column: {column}")
        with self._session() as db:
            rows = db.execute(f"SELECT DISTINCT {column} FROM calls ORDER BY {column} LIMIT ?",  # noqa: S608
                              (limit,)).fetchall()  # fmt: skip
        return [str(r[0]) for r in rows]

    def total(self) -> int:
        with self._session() as db:
            return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM calls").fetchone()[0])

    def record(self, row: IndexedCall) -> CallRecord | None:
        """The full record of an indexed row, read from the log at its offset (None if it no longer parses)."""
        try:
            fd = os.open(self.log_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            fh.seek(row.off)
            line = fh.read(row.len)
        return parse_record(line.decode("utf-8", "replace"))
