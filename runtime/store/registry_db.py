"""The registry as rows: ``tools/registry.sqlite``, read and written one entry at a time.

``registry.json`` was one document rewritten whole on every health update (96-206 ms of CPU per
``record_success`` at 10,000 tools) and decoded whole by every reader that saw it change. Here each tool is
one row ``(role, seq, entry JSON)``; ``meta`` holds the schema version, a *generation* (a random token, new on
every delete and every rebuild or migration) and the last change *sequence* number. Every write gives the row
it writes the next sequence number in the same transaction, so:

- a write touches one row (the caller holds the store lock: the read-modify-write sees the latest row);
- a reader that holds the registry as of ``(generation, seq)`` reads only the rows with a larger sequence
  (another generation: everything again): :meth:`RegistryDB.read`;
- ``(generation, seq)`` names one content of the registry, across processes and across rebuilds (a rebuilt
  file has a new random generation), so anything derived from the registry can be kept under it.

A trigger bumps the sequence of a row whose entry is changed by hand (``sqlite3`` without touching ``seq``),
so such an edit is seen like a store write; two more keep the number of rows in ``meta`` (counted again on an
insert or a delete: a ``REPLACE`` by hand deletes without firing a delete trigger), so a whole read that finds
fewer rows (a truncated file can read as an empty table, without an error) knows the file is damaged.
The file is WAL: readers never block the writer or each other.
Damage to the file (not a database, truncated, a wrong or missing schema, not a regular file) raises
:class:`CorruptRegistry`, a row that does not decode or names another role is reported to the caller
(:class:`Snapshot.bad`): the ToolStore rebuilds the file, or the rows, from the role directories.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from sandforge.runtime.store.errors import SchemaTooNewError, StoreIOError, StoreLockTimeout
from sandforge.runtime.store.models import RegistryEntry, RegistryFile

#: the layout of registry.sqlite (tables, meta keys); its entries' JSON is RegistryEntry (REGISTRY_SCHEMA_VERSION)
DB_SCHEMA_VERSION = 1
_SIDE_FILES = ("-wal", "-shm")
#: connections a forked child inherited: never used, never closed (kept from the garbage collector's close)
_INHERITED: list[sqlite3.Connection] = []
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tools (role TEXT PRIMARY KEY, seq INTEGER NOT NULL, entry TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tools_by_seq ON tools (seq);
CREATE TABLE IF NOT EXISTS damaged (role TEXT NOT NULL, entry TEXT NOT NULL, found_at TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS tools_added AFTER INSERT ON tools BEGIN
    UPDATE meta SET value = (SELECT count(*) FROM tools) WHERE key = 'count';
END;
CREATE TRIGGER IF NOT EXISTS tools_removed AFTER DELETE ON tools BEGIN
    UPDATE meta SET value = (SELECT count(*) FROM tools) WHERE key = 'count';
END;
CREATE TRIGGER IF NOT EXISTS tools_hand_edit AFTER UPDATE OF entry ON tools WHEN NEW.seq = OLD.seq BEGIN
    UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'seq';
    UPDATE tools SET seq = (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'seq') WHERE role = NEW.role;
END;
"""
#: every row as one JSON object, validated by one pydantic call (a row that is not JSON fails it: then row by row)
_ALL = "SELECT '{' || coalesce(group_concat(json_quote(role) || ':' || entry, ','), '') || '}' FROM tools"


class CorruptRegistry(Exception):
    """registry.sqlite is not a registry this version can read (its rows aside: see :class:`Snapshot`)."""


class Version(NamedTuple):
    generation: str
    seq: int

    def key(self) -> str:
        """The version as one string (what a cache derived from the registry is stored under)."""
        return f"{self.generation}:{self.seq}"


@dataclass(frozen=True)
class Snapshot:
    """The registry as of ``version``. ``bad``: rows that did not decode or name another role (role -> text);
    they are absent from ``registry``."""

    version: Version
    registry: RegistryFile
    bad: dict[str, str] = field(default_factory=dict)


def registry_of(tools: dict[str, RegistryEntry]) -> RegistryFile:
    """A RegistryFile of entries already validated (not validated again: 10,000 of them on a whole read)."""
    return RegistryFile.model_construct(schema_version=2, tools=tools)


def _classify(exc: sqlite3.Error, path: Path) -> Exception:
    """A SQLite error as what it means here: the lock (busy), the disk (I/O, read-only, cannot open) or damage."""
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        if "locked" in text or "busy" in text:
            return StoreLockTimeout(f"{path}: {text}", hint="another sandforge process is using this store; retry")
        if any(w in text for w in ("readonly", "unable to open", "disk I/O", "disk is full", "out of memory")):
            return StoreIOError(f"{path}: {text}")
    return CorruptRegistry(text)


def _entry(role: str, text: object) -> RegistryEntry | None:
    """The row's entry, or None when it does not decode or belongs to another role."""
    if not isinstance(text, str | bytes):
        return None
    try:
        entry = RegistryEntry.model_validate_json(text)
    except ValidationError:
        return None
    return entry if entry.role == role else None


class RegistryDB:
    """One registry file. Connections are kept per thread (and per process: a forked child opens its own),
    and reopened when the file at the path is another one (moved aside and rebuilt by another process)."""

    def __init__(self, path: Path, *, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._local = threading.local()

    # --- connections ---------------------------------------------------------------------------------

    def _identity(self) -> tuple[int, int] | None:
        """The file's (device, inode), None when it is missing; CorruptRegistry when it is not a regular file."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreIOError(f"{self.path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CorruptRegistry("not a regular file")
        return st.st_dev, st.st_ino

    def _check_side_files(self) -> None:
        for suffix in _SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISREG(os.lstat(f"{self.path}{suffix}").st_mode):
                    raise CorruptRegistry(f"{self.path.name}{suffix} is not a regular file")

    def _open(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, timeout=self.timeout, check_same_thread=True)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # as durable as the store's fsynced file writes
        except (sqlite3.Error, UnicodeDecodeError):  # a damaged header can make even a pragma's answer garbage
            db.close()
            raise
        return db

    def connection(self) -> sqlite3.Connection | None:
        """This thread's connection to the file now at the path, or None when there is none."""
        ident = self._identity()
        held = getattr(self._local, "held", None)
        if held is not None and (ident is None or held[0] != (os.getpid(), ident)):
            if held[0][0] == os.getpid():
                held[1].close()
            else:  # inherited across fork: closing it here could checkpoint under the parent's feet
                _INHERITED.append(held[1])
            self._local.held = held = None
        if ident is None:
            return None
        if held is None:
            self._check_side_files()
            try:
                db = self._open(self.path)
            except sqlite3.Error as exc:
                raise _classify(exc, self.path) from None
            except UnicodeDecodeError as exc:
                raise CorruptRegistry(str(exc)) from None
            self._local.held = held = ((os.getpid(), ident), db)
        conn: sqlite3.Connection = held[1]
        return conn

    def close(self) -> None:
        """Close this thread's connection (before the file is moved aside)."""
        held = getattr(self._local, "held", None)
        if held is not None:
            held[1].close()
            self._local.held = None

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection | None]:
        db = self.connection()
        if db is None:
            yield None
            return
        try:
            db.execute(begin)
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # text that is not UTF-8: damage too
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK")
            raise (_classify(exc, self.path) if isinstance(exc, sqlite3.Error) else CorruptRegistry(str(exc))) from None

    # --- reads ---------------------------------------------------------------------------------------

    def _version(self, db: sqlite3.Connection) -> Version:
        try:
            meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('schema', 'generation', 'seq')"))
        except sqlite3.OperationalError as exc:  # no such table: not a registry
            raise CorruptRegistry(str(exc)) from None
        schema, generation, seq = meta.get("schema"), meta.get("generation"), meta.get("seq")
        if not isinstance(schema, str) or not schema.isdigit():
            raise CorruptRegistry(f"bad schema version {schema!r}")
        if int(schema) > DB_SCHEMA_VERSION:
            raise SchemaTooNewError(self.path, "registry", int(schema), DB_SCHEMA_VERSION)
        if int(schema) != DB_SCHEMA_VERSION or not isinstance(generation, str) or not generation:
            raise CorruptRegistry(f"bad schema version {schema!r} or generation {generation!r}")
        if not isinstance(seq, str | int) or not str(seq).isdigit():
            raise CorruptRegistry(f"bad sequence number {seq!r}")
        return Version(generation, int(seq))

    def version(self) -> Version | None:
        """The registry's version now (one small read), None when the file is missing."""
        with self._transaction("BEGIN") as db:
            return None if db is None else self._version(db)

    def count(self) -> int | None:
        """How many tools the registry holds (the row-count trigger's figure: one small read, nothing decoded),
        None when the file is missing or the figure unreadable."""
        with self._transaction("BEGIN") as db:
            if db is None:
                return None
            self._version(db)
            row = db.execute("SELECT value FROM meta WHERE key = 'count'").fetchone()
        value = row[0] if row is not None else None
        return int(value) if isinstance(value, str | int) and str(value).isdigit() else None

    def read(self, held: Snapshot | None) -> Snapshot | None:
        """The registry now: ``held`` itself when nothing changed, ``held`` plus the rows written since when
        only rows were written (same generation), else every row. None when the file is missing."""
        with self._transaction("BEGIN") as db:
            if db is None:
                return None
            version = self._version(db)
            if held is not None and held.version == version:
                return held
            if held is not None and held.version.generation == version.generation and held.version.seq < version.seq:
                rows = db.execute("SELECT role, entry FROM tools WHERE seq > ?", (held.version.seq,)).fetchall()
                return self._patched(held, version, rows)
            return self._whole(db, version)

    @staticmethod
    def _patched(held: Snapshot, version: Version, rows: list[tuple[str, str]]) -> Snapshot:
        tools = dict(held.registry.tools)
        bad = dict(held.bad)
        for role, text in rows:
            entry = _entry(role, text)
            if entry is None:
                tools.pop(role, None)
                bad[role] = str(text)
            else:
                tools[role] = entry
                bad.pop(role, None)
        registry = registry_of(tools)
        return Snapshot(version, registry, bad)

    def _whole(self, db: sqlite3.Connection, version: Version) -> Snapshot:
        found = self._read_whole(db, version)
        count = db.execute("SELECT value FROM meta WHERE key = 'count'").fetchone()
        if count is None or not str(count[0]).isdigit() or int(count[0]) > len(found.registry.tools) + len(found.bad):
            raise CorruptRegistry(f"fewer rows than meta counts ({count})")
        return found

    def _read_whole(self, db: sqlite3.Connection, version: Version) -> Snapshot:
        try:
            text = db.execute(_ALL).fetchone()[0]
            registry = RegistryFile.model_validate_json(f'{{"schema_version":2,"tools":{text}}}')
            if all(key == entry.role for key, entry in registry.tools.items()):
                return Snapshot(version, registry)
        except (sqlite3.OperationalError, ValidationError):  # a row is not JSON, or not an entry
            pass
        tools: dict[str, RegistryEntry] = {}
        bad: dict[str, str] = {}
        for role, text in db.execute("SELECT role, entry FROM tools"):
            entry = _entry(role, text)
            if entry is None:
                bad[str(role)] = str(text)
            else:
                tools[role] = entry
        return Snapshot(version, registry_of(tools), bad)

    def changed_since(self, version: Version) -> tuple[Version, list[RegistryEntry], list[str]] | None:
        """The registry's version now, the entries written since ``version`` and the roles whose rows are bad,
        or None when that takes a whole read (another generation, or the file is missing)."""
        with self._transaction("BEGIN") as db:
            if db is None:
                return None
            now = self._version(db)
            if now.generation != version.generation or now.seq < version.seq:
                return None
            rows = db.execute("SELECT role, entry FROM tools WHERE seq > ?", (version.seq,)).fetchall()
        entries = [(role, _entry(role, text)) for role, text in rows]
        return now, [e for _, e in entries if e is not None], [r for r, e in entries if e is None]

    def get(self, role: str) -> RegistryEntry | None:
        """One row (None: no such tool, or its row is bad). Raises CorruptRegistry on damage; None if missing."""
        with self._transaction("BEGIN") as db:
            if db is None:
                return None
            self._version(db)
            row = db.execute("SELECT entry FROM tools WHERE role = ?", (role,)).fetchone()
        return _entry(role, row[0]) if row is not None else None

    # --- writes (the caller holds the store lock) ----------------------------------------------------

    def put(self, role: str, change: Callable[[RegistryEntry | None], RegistryEntry]) -> tuple[RegistryEntry, Version]:
        """Read-modify-write of one row in one transaction: ``change`` gets the stored entry (None: none, or a
        bad row) and returns the new one."""
        with self._transaction("BEGIN IMMEDIATE") as db:
            if db is None:
                raise CorruptRegistry("registry.sqlite vanished while the store lock was held")
            version = self._version(db)
            row = db.execute("SELECT entry FROM tools WHERE role = ?", (role,)).fetchone()
            new = change(_entry(role, row[0]) if row is not None else None)
            seq = version.seq + 1
            db.execute(  # an upsert, not REPLACE: that would delete without firing the row-count trigger
                "INSERT INTO tools VALUES (?, ?, ?) ON CONFLICT (role) DO UPDATE SET seq = excluded.seq, "
                "entry = excluded.entry",
                (role, seq, new.model_dump_json()),
            )
            db.execute("UPDATE meta SET value = ? WHERE key = 'seq'", (str(seq),))
        return new, Version(version.generation, seq)

    def delete(self, roles: Iterable[str], *, damaged: dict[str, str] | None = None, now: str = "") -> Version:
        """Drop rows (their text kept in ``damaged`` when given); a new generation: readers read everything."""
        with self._transaction("BEGIN IMMEDIATE") as db:
            if db is None:
                raise CorruptRegistry("registry.sqlite vanished while the store lock was held")
            version = self._version(db)
            db.executemany("INSERT INTO damaged VALUES (?, ?, ?)", [(r, t, now) for r, t in (damaged or {}).items()])
            db.executemany("DELETE FROM tools WHERE role = ?", [(r,) for r in roles])
            generation = secrets.token_hex(8)
            db.execute("UPDATE meta SET value = ? WHERE key = 'generation'", (generation,))
        return Version(generation, version.seq)

    def create(self, tools: dict[str, RegistryEntry]) -> None:
        """Write a new registry of ``tools`` beside the path and rename it into place (migration, rebuild).
        Whatever was at the path (and its side files) must have been moved aside by the caller."""
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)
            db = self._open(tmp)
            try:
                db.executescript(_SCHEMA)
                db.execute("BEGIN IMMEDIATE")
                db.executemany(
                    "INSERT INTO tools VALUES (?, ?, ?)",
                    [(role, i, e.model_dump_json()) for i, (role, e) in enumerate(sorted(tools.items()), 1)],
                )
                n = str(len(tools))  # (the row-count trigger found no 'count' to move: it is written here)
                meta = {"schema": str(DB_SCHEMA_VERSION), "generation": secrets.token_hex(8), "seq": n, "count": n}
                db.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
                db.execute("COMMIT")
            finally:
                db.close()  # the last connection: the WAL is checkpointed into the file and removed
            for suffix in _SIDE_FILES:  # never leave another file's WAL beside the new one
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{self.path}{suffix}").unlink()
            tmp.replace(self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except (OSError, sqlite3.Error) as exc:
            for suffix in ("", *_SIDE_FILES):
                with contextlib.suppress(OSError):
                    Path(f"{tmp}{suffix}").unlink()
            raise StoreIOError(f"cannot write {self.path}: {exc}") from None
        self.close()

    def move_aside(self, dest: Path) -> None:
        """Rename the file (and its side files) to ``dest`` (the caller holds the store lock)."""
        self.close()
        for suffix in ("", *_SIDE_FILES):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.path}{suffix}").rename(f"{dest}{suffix}")
