"""The tools board persisted between processes: a fresh process's first page reads no registry and no method file.

The Overview and Tools pages count, sort and filter *every* tool (10,000 in the benchmark), which needs, per
tool, a few registry fields and its methods' badges. Decoding the whole registry alone took 0.28 s there, the
entries' digests 0.2 s, the methods' persisted health 0.35 s. The board keeps just those fields per tool
(:class:`ToolSnap`) in the health snapshot's file (:mod:`.healthsnap`, same context: prompt version, selection
policy, this module's version), with two keys:

- each row carries the digest of the registry entry it was computed from: a process that decoded the registry
  reuses a row only for an entry with that digest (every store write changes the tool's entry, as in
  :mod:`.healthsnap`), and computes the others;
- the board as a whole carries the registry version it describes (every row, none more): the registry's
  ``(generation, seq)`` (:mod:`runtime.store.registry_db`), read without decoding anything. A process that finds
  the registry at that version takes the whole board; one that finds a later sequence of the same generation
  takes the board and computes again only the rows of the entries written since (one small read of the
  registry: no whole decode, no digest of every entry); another generation (a tool deleted, a rebuild) or no
  known version rebuilds from the whole registry. A save that raced another process's (the board's own
  generation counter moved) rewrites the whole board.

A method file changed by hand, the registry untouched, is not seen by the counts until a page shows that
tool: the rows a page shows are checked against their method files' stamps (``HealthCache.methods(verify=True)``)
and a difference amends the board (as a long-running process has always done). The entries of the rows a
page shows are read back by role and entry digest, never by role alone.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from sandforge.runtime.dashboard.healthsnap import HealthSnapshot
from sandforge.runtime.dashboard.toolhealth import BADGE_ORDER, Badge, MethodHealth, worst
from sandforge.runtime.store.models import RegistryEntry

log = logging.getLogger(__name__)


class Mark(NamedTuple):
    """One method's place on the board: its badge and recent failure rate."""

    method: str
    badge: Badge
    rate: float


@dataclass(slots=True)
class ToolSnap:
    """One tool as the lists count, sort and filter it. ``entry`` is None when the row came from the persisted
    board (read it with :meth:`BoardSnapshot.entries` for the rows a page shows). Never changed once made
    (shared by the caches; not frozen only because a frozen dataclass costs twice as much to make, and a first
    Tools page makes 10,000)."""

    role: str
    purpose: str | None
    usage_count: int
    failure_count: int
    activity: float  # last use (or creation), a POSIX timestamp: the "last used" order
    capabilities: tuple[str, ...]
    marks: tuple[Mark, ...]
    digest: bytes = field(repr=False)
    badge: Badge  # the worst of its methods'
    rate: float  # the highest of its methods' recent failure rates
    entry: RegistryEntry | None = field(default=None, compare=False, repr=False)


def with_entry(t: ToolSnap, entry: RegistryEntry) -> ToolSnap:
    """``t`` holding its entry (``dataclasses.replace`` costs four times as much: 10,000 of them on a rebuild)."""
    return ToolSnap(t.role, t.purpose, t.usage_count, t.failure_count, t.activity, t.capabilities, t.marks, t.digest,
                    t.badge, t.rate, entry)  # fmt: skip


def tool_snap(entry: RegistryEntry, methods: Iterable[MethodHealth], digest: bytes) -> ToolSnap:
    marks = tuple(Mark(m.method, m.badge, m.recent_failure_rate) for m in methods)
    return ToolSnap(entry.role, entry.purpose, entry.usage_count, entry.failure_count,
                    (entry.last_used_at or entry.created_at).timestamp(), tuple(entry.capabilities), marks, digest,
                    worst([m.badge for m in marks]), max((m.rate for m in marks), default=0.0), entry)  # fmt: skip


def _row(t: ToolSnap) -> tuple[object, ...]:
    marks = json.dumps([[m.method, m.badge, m.rate] for m in t.marks], separators=(",", ":"))
    return (t.role, t.digest, t.purpose, t.usage_count, t.failure_count, t.activity, t.badge, t.rate,
            json.dumps(t.capabilities, separators=(",", ":")), marks)  # fmt: skip


_BADGES = frozenset(BADGE_ORDER)
#: every row as one JSON document: one parse in C instead of two per row (10,000 rows: ~25 ms, not ~250)
_ALL_ROWS = (
    "SELECT json_group_array(json_array(role, hex(digest), purpose, usage, failures, activity, badge, rate, "
    "json(capabilities), json(marks))) FROM board"
)


def _rows(db: sqlite3.Connection, roles: list[str] | None = None) -> list[ToolSnap]:
    """Every row, or those of ``roles`` (10,000 of them on a first Tools page: checked in bulk, then made with the
    least work)."""
    if roles is None:
        data = json.loads(db.execute(_ALL_ROWS).fetchone()[0])
    else:
        marks = ",".join("?" * len(roles))
        data = json.loads(db.execute(f"{_ALL_ROWS} WHERE role IN ({marks})", roles).fetchone()[0])
    if not ({f[6] for f in data} | {m[1] for f in data for m in f[9]}) <= _BADGES:
        raise ValueError("a board row holds what is not a badge")
    if {len(f) for f in data} - {10} or {len(m) for f in data for m in f[9]} - {3}:
        raise ValueError("a board row is not of this version")
    new = tuple.__new__
    rows = [ToolSnap(f[0], f[2], f[3], f[4], f[5], tuple(f[8]), tuple([new(Mark, m) for m in f[9]]),
                     bytes.fromhex(f[1]), f[6], f[7]) for f in data]  # fmt: skip
    rows.sort(key=lambda t: t.role)  # an aggregate's order is not promised
    return rows


@dataclass(frozen=True)
class Summary:
    """What the Overview shows of the board: tools, artifacts, methods per badge, the degraded or stale ones
    (worst first, the first FLAGGED_SHOWN of them) and how many there are."""

    tools: int
    artifacts: int
    counts: dict[str, int]
    flagged: list[tuple[str, Mark]]
    flagged_total: int

    def to_json(self) -> str:
        return json.dumps([self.tools, self.artifacts, self.counts, [[r, *m] for r, m in self.flagged],
                           self.flagged_total], separators=(",", ":"))  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Summary:
        tools, artifacts, counts, flagged, total = json.loads(text)
        if set(counts) != _BADGES or any(f[2] not in _BADGES for f in flagged):
            raise ValueError("not a board summary")
        marks = [(str(r), Mark(str(m), b, float(x))) for r, m, b, x in flagged]
        return cls(int(tools), int(artifacts), {k: int(counts[k]) for k in BADGE_ORDER}, marks, int(total))

    def updated(self, old: dict[str, ToolSnap], new: list[ToolSnap]) -> Summary | None:
        """This summary with the rows ``old`` (by role; a role absent was not on the board) replaced by ``new``,
        without the other rows, or None when that cannot be known: a flagged method listed here left the list
        and more were flagged than it shows (the next one is on no list kept here)."""
        counts, artifacts, tools = dict(self.counts), self.artifacts, self.tools
        roles = {t.role for t in new}
        total = self.flagged_total
        for t, sign in [*((o, -1) for o in old.values()), *((t, 1) for t in new)]:
            for m in t.marks:
                counts[m.badge] += sign
                artifacts += sign * (m.badge != "missing")
                total += sign * (m.badge in ("degraded", "stale"))
        tools += len(roles - set(old))
        kept = [f for f in self.flagged if f[0] not in roles]
        if len(kept) < FLAGGED_SHOWN and self.flagged_total > len(self.flagged):
            return None  # the methods ranked after the ones listed: not known here
        flagged = kept + [(t.role, m) for t in new for m in t.marks if m.badge in ("degraded", "stale")]
        flagged.sort(key=_flag_order)
        return Summary(tools, artifacts, counts, flagged[:FLAGGED_SHOWN], total)


def _flag_order(f: tuple[str, Mark]) -> tuple[bool, float, str, str]:
    return f[1].badge != "degraded", -f[1].rate, f[0], f[1].method


#: the degraded or stale methods the Overview lists
FLAGGED_SHOWN = 20


def summarize_board(rows: list[ToolSnap]) -> Summary:
    counts: dict[str, int] = dict.fromkeys(BADGE_ORDER, 0)
    flagged: list[tuple[str, Mark]] = []
    artifacts = 0
    for t in rows:
        for m in t.marks:
            counts[m.badge] += 1
            artifacts += m.badge != "missing"
            if m.badge in ("degraded", "stale"):
                flagged.append((t.role, m))
    flagged.sort(key=_flag_order)
    return Summary(len(rows), artifacts, counts, flagged[:FLAGGED_SHOWN], len(flagged))


@dataclass(frozen=True)
class StoredBoard:
    """What the snapshot holds: the registry version its rows describe (None: not known to be whole), the
    generation it was read at, and the rows in role order."""

    registry: str | None
    generation: int
    rows: list[ToolSnap]


class BoardSnapshot:
    """The persisted board of one tenant, in its health snapshot's file."""

    def __init__(self, snapshot: HealthSnapshot) -> None:
        self.snapshot = snapshot

    def load(self) -> StoredBoard:
        registry: str | None = None
        generation, rows = -1, []
        with self.snapshot.connection() as db:
            if db is not None:
                db.execute("BEGIN")  # one read transaction: the meta and the rows of the same save
                meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('board', 'board_gen')").fetchall())
                generation = int(meta.get("board_gen", "0"))
                registry = meta.get("board") or None
                try:
                    rows = _rows(db)
                except (ValueError, TypeError, IndexError) as exc:  # not what this module writes: none used
                    log.warning("health snapshot: unreadable board (%s); rebuilt", exc)
                    registry, rows = None, []
                db.execute("COMMIT")
        return StoredBoard(registry, generation, rows)

    def save(
        self, registry: str | None, generation: int, rows: list[ToolSnap],
        changed: list[tuple[ToolSnap, str | None]], gone: list[str], summary: Summary | None = None,
    ) -> int:  # fmt: skip
        """Write the ``changed`` rows (with their entry's JSON when known) and drop the ``gone`` roles, or write
        all ``rows`` when another process saved since ``generation``; the board then describes ``registry``
        (None: not known to be whole), and ``summary`` (of ``rows``: computed here when not given). Returns the new
        generation (-1 when nothing was written)."""
        new = -1
        with self.snapshot.connection() as db:
            if db is not None:
                db.execute("BEGIN IMMEDIATE")
                found = db.execute("SELECT value FROM meta WHERE key = 'board_gen'").fetchone()
                current = int(found[0]) if found else 0
                whole = current != generation
                if whole:
                    db.execute("DELETE FROM board")
                db.executemany("INSERT OR REPLACE INTO board VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [_row(t) for t in rows] if whole else [_row(t) for t, _ in changed])  # fmt: skip
                db.executemany("DELETE FROM board WHERE role = ?", [] if whole else [(r,) for r in gone])
                db.executemany("INSERT OR REPLACE INTO board_entry VALUES (?, ?, ?)",
                               [(t.role, t.digest, text) for t, text in changed if text is not None])  # fmt: skip
                if whole or gone:
                    db.execute("DELETE FROM board_entry WHERE role NOT IN (SELECT role FROM board)")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('board', ?)", (registry or "",))
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('board_summary', ?)",
                    ((summary or summarize_board(rows)).to_json(),),
                )
                db.execute("INSERT OR REPLACE INTO meta VALUES ('board_gen', ?)", (str(current + 1),))
                db.execute("COMMIT")
                new = current + 1
        return new

    def version(self) -> str | None:
        """The registry version the board describes (one read of ``meta``)."""
        at: str | None = None
        with self.snapshot.connection() as db:
            if db is not None:
                row = db.execute("SELECT value FROM meta WHERE key = 'board'").fetchone()
                at = row[0] if row is not None and row[0] else None
        return at

    def rows_of(self, roles: list[str], at: str) -> tuple[dict[str, ToolSnap], Summary] | None:
        """The board's rows of ``roles`` (a role it has no row for is absent) and its summary, while it describes
        registry version ``at`` (one read transaction), else None; None too when they are unreadable."""
        found: tuple[dict[str, ToolSnap], Summary] | None = None
        with self.snapshot.connection() as db:
            if db is not None:
                db.execute("BEGIN")
                meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('board', 'board_summary')"))
                if meta.get("board") == at and "board_summary" in meta:
                    try:
                        rows = {t.role: t for t in _rows(db, roles)} if roles else {}
                        found = rows, Summary.from_json(meta["board_summary"])
                    except (ValueError, TypeError, IndexError, KeyError) as exc:
                        log.warning("health snapshot: unreadable board rows or summary (%s)", exc)
                db.execute("COMMIT")
        return found

    def advance(self, at: str, registry: str, changed: list[tuple[ToolSnap, str]], summary: Summary) -> bool:
        """Move the board from registry version ``at`` to ``registry``: the ``changed`` rows (every row written
        between the two) and the new summary, only if the board still describes ``at`` (one transaction)."""
        done = False
        with self.snapshot.connection() as db:
            if db is not None:
                db.execute("BEGIN IMMEDIATE")
                meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('board', 'board_gen')"))
                if meta.get("board") == at:
                    db.executemany("INSERT OR REPLACE INTO board VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                   [_row(t) for t, _ in changed])  # fmt: skip
                    db.executemany("INSERT OR REPLACE INTO board_entry VALUES (?, ?, ?)",
                                   [(t.role, t.digest, text) for t, text in changed])  # fmt: skip
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('board', ?)", (registry,))
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('board_summary', ?)", (summary.to_json(),))
                    gen = str(int(meta.get("board_gen", "0")) + 1)
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('board_gen', ?)", (gen,))
                    done = True
                db.execute("COMMIT")
        return done

    def summary(self, registry: str) -> Summary | None:
        """The summary saved with the board, when the board describes ``registry`` (else None), without
        reading its rows: a fresh process's first Overview."""
        found: Summary | None = None
        with self.snapshot.connection() as db:
            if db is not None:
                meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('board', 'board_summary')"))
                if meta.get("board") == registry and "board_summary" in meta:
                    try:
                        found = Summary.from_json(meta["board_summary"])
                    except (ValueError, TypeError, KeyError) as exc:
                        log.warning("health snapshot: unreadable board summary (%s)", exc)
        return found

    def entry(self, role: str, registry: str) -> RegistryEntry | None:
        """The entry of ``role`` as the board holds it, when the board describes ``registry`` (else None)."""
        found: RegistryEntry | None = None
        with self.snapshot.connection() as db:
            if db is not None:
                row = db.execute(
                    "SELECT e.entry FROM board b JOIN board_entry e ON e.role = b.role AND e.digest = b.digest "
                    "WHERE b.role = ? AND EXISTS (SELECT 1 FROM meta WHERE key = 'board' AND value = ?)",
                    (role, registry),
                ).fetchone()
                if row is not None:
                    try:
                        found = RegistryEntry.model_validate_json(row[0])
                    except ValueError:
                        log.warning("health snapshot: unreadable entry of %r ignored", role)
        return found

    def entries(self, snaps: list[ToolSnap]) -> dict[str, RegistryEntry]:
        """The entries of ``snaps`` that came from the snapshot, by role, each only if it is still stored under
        the row's digest (a missing one is simply absent: the caller reads it from the store)."""
        wanted = {t.role: t.digest for t in snaps if t.entry is None}
        found: dict[str, RegistryEntry] = {}
        if not wanted:
            return found
        with self.snapshot.connection() as db:
            if db is not None:
                marks = ",".join("?" * len(wanted))
                rows = db.execute(f"SELECT role, digest, entry FROM board_entry WHERE role IN ({marks})",  # noqa: S608
                                  list(wanted)).fetchall()  # fmt: skip
                for role, digest, text in rows:
                    if wanted.get(role) == digest:
                        try:
                            found[role] = RegistryEntry.model_validate_json(text)
                        except ValueError:
                            log.warning("health snapshot: unreadable entry of %r ignored", role)
        return found
