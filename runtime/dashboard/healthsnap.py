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
from pathlib import Path

from sandforge.runtime.store.models import RegistryEntry
from sandforge.runtime.store.selection import SelectionPolicy

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS health (
    role TEXT NOT NULL, method TEXT NOT NULL, key BLOB NOT NULL, value TEXT NOT NULL, PRIMARY KEY (role, method)
) WITHOUT ROWID;
"""


def entry_digest(entry: RegistryEntry) -> bytes:
    """The digest of a registry entry's content (every field: any change is a different digest)."""
    return hashlib.blake2b(entry.model_dump_json().encode(), digest_size=16).digest()


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

    def _restart(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM health")
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
