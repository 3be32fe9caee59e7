"""Method health persisted between processes: the first page of a fresh dashboard process on 10,000 tools
reads the registry and one stamp per method file, not every method file (decoding them all took 12.4 s).

A row is used only when its key still holds, so the snapshot can never show stale health as fresh:

- the digest of the tool's registry entry as the store holds it now: every store write that changes a method
  file (an outcome, a new generation, a rollback), in this process or another, rewrites the tool's entry
  under the store's lock (usage, counters, last use, capabilities, contract): the same content the store's own
  readers compare to see a change;
- the method file's stamp (:func:`~.toolhealth.file_stamp`: inode, mtime, size, trusted only RACY_S after the
  file was written), which also catches a file changed behind the store's back;
- for the whole file, what health is computed with: this module's version, the prompt version and the
  store's selection policy (a change drops every row).

A row whose key does not hold is computed again from the method file and written back. Rows are written by
whichever process computed them; a late writer's row for an older file simply fails its key next time.
The snapshot is only a cache: an unreadable or corrupt file is replaced, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from sandforge.runtime.store.models import RegistryEntry
from sandforge.runtime.store.selection import SelectionPolicy

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 5
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS health (
    role TEXT NOT NULL, method TEXT NOT NULL, key BLOB NOT NULL, value TEXT NOT NULL, PRIMARY KEY (role, method)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS board (
    role TEXT PRIMARY KEY, digest BLOB NOT NULL, purpose TEXT, usage INTEGER NOT NULL, failures INTEGER NOT NULL,
    activity REAL NOT NULL, badge TEXT NOT NULL, rate REAL NOT NULL, capabilities TEXT NOT NULL, marks TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS board_entry (role TEXT PRIMARY KEY, digest BLOB NOT NULL, entry TEXT NOT NULL);
"""
#: the tables :meth:`HealthSnapshot._restart` empties (every row computed under another context)
_TABLES = ("health", "board", "board_entry", "meta")


def entry_digest(entry: RegistryEntry | str) -> bytes:
    """The digest of a registry entry's content (every field: any change is a different digest), given the
    entry or its ``model_dump_json()``."""
    text = entry if isinstance(entry, str) else entry.model_dump_json()
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def policy_text(policy: SelectionPolicy) -> str:
    """The selection policy as the same text in every process (its sets sorted: their order varies with the
    interpreter's hash seed)."""
    return json.dumps(policy.model_dump(), sort_keys=True, default=lambda v: sorted(map(str, v)))


def row_key(digest: bytes, stamp: tuple[int, int, int]) -> bytes:
    return digest + struct.pack("<QqQ", *stamp)


class HealthSnapshot:
    """The persisted rows of one tenant: ``(role, method) -> (key, MethodHealth JSON)``."""

    def __init__(self, path: Path, context: str) -> None:
        self.path = path
        self.context = f"{SNAPSHOT_VERSION}|{context}"
        self._lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        return db

    def load(self) -> dict[tuple[str, str], tuple[bytes, str]]:
        """Every row, or none when they were computed under another context (then dropped)."""
        try:
            with self._lock:
                db = self._open()
                try:
                    row = db.execute("SELECT value FROM meta WHERE key = 'context'").fetchone()
                    if row is None or row[0] != self.context:
                        self._restart(db)
                        return {}
                    return {(r, m): (k, v) for r, m, k, v in db.execute("SELECT role, method, key, value FROM health")}
                finally:
                    db.close()
        except sqlite3.Error as exc:
            log.warning("health snapshot %s unusable (%s); starting a new one", self.path, exc)
            self._discard()
            return {}

    def rows(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[bytes, str]]:
        """The rows of these ``(role, method)`` pairs only (a page's few, without reading every row)."""
        found: dict[tuple[str, str], tuple[bytes, str]] = {}
        with self.connection() as db:
            if db is not None:
                for role, method in pairs:
                    row = db.execute("SELECT key, value FROM health WHERE role = ? AND method = ?",
                                     (role, method)).fetchone()  # fmt: skip
                    if row is not None:
                        found[(role, method)] = (row[0], row[1])
        return found

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection | None]:
        """A connection to the snapshot whose rows were computed under this context (emptied first when they
        were not), or None when the file is unusable. A SQLite error, opening it or in the ``with`` body, is
        logged and the file discarded (a new one is started next time): the body's results must have defaults."""
        with self._lock:
            db: sqlite3.Connection | None = None
            try:
                db = self._open()
                row = db.execute("SELECT value FROM meta WHERE key = 'context'").fetchone()
                if row is None or row[0] != self.context:
                    self._restart(db)
            except sqlite3.Error as exc:
                if db is not None:
                    db.close()
                self._unusable(exc)
                yield None
                return
            try:
                yield db
            except sqlite3.Error as exc:
                self._unusable(exc)
            finally:
                db.close()

    def _unusable(self, exc: sqlite3.Error) -> None:
        log.warning("health snapshot %s unusable (%s); starting a new one", self.path, exc)
        self._discard()

    def _restart(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        for table in _TABLES:
            db.execute(f"DELETE FROM {table}")  # noqa: S608 (fixed names)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('context', ?)", (self.context,))
        db.execute("COMMIT")

    def _discard(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(f"{self.path}{suffix}").unlink()

    def save(self, rows: list[tuple[str, str, bytes, str]], gone: list[tuple[str, str]] | None = None) -> None:
        """Write ``(role, method, key, value)`` rows and drop the ``gone`` ones (methods no longer in the
        registry) in one transaction (best effort: it is only a cache)."""
        if not rows and not gone:
            return
        try:
            with self._lock:
                db = self._open()
                try:
                    db.execute("BEGIN IMMEDIATE")
                    row = db.execute("SELECT value FROM meta WHERE key = 'context'").fetchone()
                    if row is not None and row[0] != self.context:  # another version took it over: leave it
                        db.execute("ROLLBACK")
                        return
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('context', ?)", (self.context,))
                    db.executemany("INSERT OR REPLACE INTO health VALUES (?, ?, ?, ?)", rows)
                    db.executemany("DELETE FROM health WHERE role = ? AND method = ?", gone or [])
                    db.execute("COMMIT")
                finally:
                    db.close()
        except sqlite3.Error as exc:
            log.warning("health snapshot %s not written (%s)", self.path, exc)
