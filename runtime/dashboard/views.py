"""The data of every dashboard page, as pydantic models: the JSON twins return them, the pages render them.

A :class:`Board` is one tenant's view: its ToolStore, its call-log index and the health cache. Builders
read, never write (rollback is the one action, in :mod:`.actions`). Lists are paginated so a page's cost
does not grow with the store: tools 50 a page, calls by keyset (``before`` an id), patterns 50 roles a page.
"""

from __future__ import annotations

import difflib
import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from sandforge.runtime.agent.calllog import CallRecord, CallSecurityEvent, CallSource
from sandforge.runtime.dashboard.boardsnap import (
    BoardSnapshot,
    Mark,
    Summary,
    ToolSnap,
    summarize_board,
    tool_snap,
    with_entry,
)
from sandforge.runtime.dashboard.callindex import (
    CallFilter,
    CallIndex,
    IndexedCall,
    IndexedSecurityEvent,
    SecurityFilter,
)
from sandforge.runtime.dashboard.healthsnap import HealthSnapshot, policy_text
from sandforge.runtime.dashboard.toolhealth import (
    BADGE_ORDER,
    Badge,
    HealthCache,
    MethodHealth,
    worst,
)
from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.guardrails.engine import validate
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.models import MethodArtifact, PatternEvent, RegistryEntry
from sandforge.runtime.store.patterns import (
    DEFAULT_PROMOTION_THRESHOLD,
    DEFAULT_SUMMARY_WINDOW,
    promotion_signal,
    render_recent_patterns,
    summarize,
)
from sandforge.sandbox import SandboxConfig
from sandforge.sandbox.protocol import SecurityEvent

log = logging.getLogger(__name__)

PAGE_SIZE = 50
#: the longest a page waits for the first full health build of a registry of unknown size before it renders
#: without it (and says so)
WAIT_S = 0.1
#: a board of at most this many tools is waited for whole (~0.1 s of method files): its pages never say "computing"
INLINE_TOOLS = 500
#: the longest a tools snapshot is reused while the registry does not change (files changed by hand show then)
SNAPSHOT_S = 30.0
SortKey = Literal["role", "usage", "failures", "failure_rate", "last_used", "badge"]


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class HealthBuilding(BaseModel):
    """The tools' health is being computed for the first time (a store whose board was never built, or whose
    context changed: prompt version, selection policy): the page shows what it knows without it, and says so."""

    done: int = Field(description="tools whose health is computed")
    total: int | None = Field(description="tools in the registry, None until the registry has been read")


def _waited(build: _Build, bound: float) -> bool:
    """Whether ``build`` ended: a small board's waited for to its end, a large one's not at all (it takes
    seconds; and once the store decodes the registry, one call that holds the GIL for ~0.3 s, a waiting page
    could not answer before that ends), one of unknown size for ``bound`` seconds."""
    if build.total is not None:
        return build.total <= INLINE_TOOLS and build.finished.wait()
    return build.finished.wait(bound)


class _Build:
    """One background build of the whole board: its progress, and how it ended."""

    def __init__(self) -> None:
        self.done = 0
        self.total: int | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def progress(self) -> HealthBuilding:
        return HealthBuilding(done=self.done, total=self.total)


class Board:
    """One tenant's dashboard data sources (built once per tenant and kept: the caches live here)."""

    def __init__(
        self, *, tenant: str, store: ToolStore, call_log: Path, policy: Policy | Callable[[], Policy],
        sandbox: SandboxConfig | Callable[[], SandboxConfig],
    ) -> None:  # fmt: skip
        self.tenant = tenant
        self.store = store
        self.calls = CallIndex(call_log)
        context = f"{PROMPT_VERSION}|{policy_text(store.policy)}"
        snapshot = HealthSnapshot(call_log.with_name("dashboard-health.sqlite"), context)
        self.health = HealthCache(store, snapshot)
        self.boards = BoardSnapshot(snapshot)
        self._policy = policy  # or how to get it: the tenant's is built on first use (0.36 s on a busy machine),
        self._sandbox = sandbox  # and only the artifact and call pages need it
        self._snapshot: tuple[str | None, float, list[ToolSnap]] | None = None
        self._registry: str | None = None  # the registry version the rows in memory describe
        self._generation = -1  # of the persisted board, as this process last read or wrote it
        self._loaded = False
        self._rebuilding = threading.Lock()
        self._starting = threading.Lock()  # one background build at a time
        self._build: _Build | None = None  # the last background build of the whole board (running or ended)
        self._entries: dict[tuple[str, bytes], RegistryEntry] = {}  # read from the board, by (role, entry digest)
        self._summary: tuple[str, float, Summary] | None = None  # persisted, read before the rows
        self.derived: dict[Any, Any] = {}  # what is computed from the snapshot, kept with it
        self._made: tuple[list[ToolSnap], Summary] | None = None  # the summary of the rows last rebuilt

    @functools.cached_property
    def policy(self) -> Policy:
        return self._policy if isinstance(self._policy, Policy) else self._policy()

    @functools.cached_property
    def sandbox(self) -> SandboxConfig:
        return self._sandbox if isinstance(self._sandbox, SandboxConfig) else self._sandbox()

    def close(self) -> None:
        self.calls.close()

    def _version(self) -> str | None:
        """The registry's version now (:meth:`~ToolStore.registry_version`: one small read, nothing decoded)."""
        return self.store.registry_version()

    def tools(self) -> list[ToolSnap]:
        """Every tool with its methods' badges, in role order. Kept while the registry keeps its version (its
        ``(generation, seq)``) and for at most SNAPSHOT_S (method files changed by hand show then); then taken
        again: from the persisted board (:mod:`.boardsnap`) when it describes this version, else the board (or
        the rows in memory) with only the rows written since updated (:meth:`~ToolStore.changed_since`), else
        rebuilt from the whole registry, only the entries that changed reading their method files again.
        Successes still queued by the tenant's write-behind are written first: the pages show every call that
        has returned (the call log already does). A full rebuild with nothing earlier to start from runs in
        the background (:meth:`tools_ready`); this waits for it, and raises when it failed."""
        while True:
            rows = self._tools()
            if rows is not None:
                return rows
            build = self._build
            assert build is not None  # _tools returns None only with a build started
            build.finished.wait()
            if build.error is not None:
                raise RuntimeError("computing the tools' health failed") from build.error

    def tools_ready(self, bound: float | None = None) -> list[ToolSnap] | HealthBuilding:
        """:meth:`tools`, or, when they need a full rebuild with nothing earlier to show, that rebuild started
        in the background (one at a time) and waited for (a board of at most INLINE_TOOLS tools to its end, a
        larger one not at all, one of unknown size ``bound`` seconds, WAIT_S): then its progress."""
        rows = self._tools()
        if rows is None:
            build = self._build
            if build is not None and _waited(build, WAIT_S if bound is None else bound):
                rows = self._tools()  # done (or failed: then a new build is started, as a next page would)
        if rows is not None:
            return rows
        build = self._build
        return build.progress() if build is not None else HealthBuilding(done=0, total=None)

    def _running(self) -> bool:
        build = self._build
        return build is not None and not build.finished.is_set()

    def _tools(self) -> list[ToolSnap] | None:
        """The rows, or None when a background build of the whole board is running (started here if needed)."""
        self.store.settle()
        version = self._version()
        now = time.monotonic()
        snap = self._snapshot
        if snap is not None and version is not None and snap[0] == version and snap[1] > now:
            return snap[2]
        if snap is None and self._running():
            return None  # not even waiting for the lock: a blocked first page would wait for the build
        with self._rebuilding:  # concurrent first pages: one reads the board (or the registry), the others wait
            if self._snapshot is not snap and (done := self._snapshot) is not None and done[0] == version:
                return done[2]
            if snap is not None and version is not None and version == self._registry:
                rows = snap[2]
            else:
                with gc_paused():  # thousands of small objects, no cycles: the collector would only cost time
                    current = self._snapshot  # a build's rows may have come meanwhile: the ones _registry describes
                    found = self._rows(version, current[2] if current is not None else None)
                if found is None:
                    return None
                rows = found
                self.derived.clear()
            self._snapshot = (version, now + SNAPSHOT_S, rows)
        return rows

    def _rows(self, version: str | None, previous: list[ToolSnap] | None) -> list[ToolSnap] | None:
        held = self._registry
        if not self._loaded:  # once per process: later, the rows in memory are the newer
            self._loaded = True
            stored = self.boards.load()
            self._generation = stored.generation
            if version is not None and stored.registry == version:
                self._registry = version
                return stored.rows
            if not previous:
                previous, held = stored.rows, stored.registry
        delta = self.store.changed_since(held) if held is not None and previous else None
        if delta is not None and previous:
            return self._patch(previous, *delta)
        if not previous:  # every method file read (10,000 tools: seconds): in the background, pages never wait
            self._start_build()
            return None
        return self._rebuild(previous)

    def _start_build(self) -> None:
        with self._starting:
            if self._running():
                return
            build = self._build = _Build()
            build.total = self.store.tool_count()  # one small read: the page says "N of M" (or waits, M small)
        threading.Thread(target=self._run_build, args=(build,), name=f"board-{self.tenant}", daemon=True).start()

    def _run_build(self, build: _Build) -> None:
        """The whole board rebuilt from the registry (nothing earlier to start from). Only one runs, and no
        other path rebuilds or patches meanwhile (they need rows, and there are none until this ends)."""
        try:
            with gc_paused():
                rows = self._rebuild(None, build)
            self.derived.clear()
            self._snapshot = (self._registry, time.monotonic() + SNAPSHOT_S, rows)
        except Exception as e:  # logged; the next page starts another build
            log.exception("computing the tools' health for tenant %s failed", self.tenant)
            build.error = e
        finally:
            build.finished.set()

    def _patch(self, previous: list[ToolSnap], version: str, entries: list[RegistryEntry]) -> list[ToolSnap]:
        """``previous`` (the rows of an earlier version of the registry, same generation: no tool deleted since)
        with the rows of the entries written since computed again."""
        rows = list(previous)
        at = {t.role: i for i, t in enumerate(rows)}
        self.health.prefetch([(e.role, m) for e in entries for m in e.methods])  # these rows, not all 10,000
        changed: list[tuple[ToolSnap, str | None]] = []
        dropped = False
        for entry in entries:
            i = at.get(entry.role)
            old = rows[i] if i is not None else None
            key, text = self.health.entry_key(entry)
            if old is not None and old.digest == key:
                rows[at[entry.role]] = with_entry(old, entry)
                continue
            new = tool_snap(entry, self.health.methods(entry), key)
            changed.append((new, text if text is not None else entry.model_dump_json()))
            if old is None:
                rows.append(new)
            else:
                rows[at[entry.role]] = new
                dropped = dropped or bool({m.method for m in old.marks} - set(entry.methods))
        if len(rows) != len(previous):
            rows.sort(key=lambda t: t.role)
        self._registry = version
        self.health.persist({(t.role, m.method) for t in rows for m in t.marks} if dropped else None)
        self._generation = self.boards.save(version, self._generation, rows, changed, [], self._summarized(rows))
        return rows

    def _rebuild(self, previous: list[ToolSnap] | None, build: _Build | None = None) -> list[ToolSnap]:
        entries, self._registry = self.store.list_tools_versioned()
        counter = build if build is not None else _Build()
        counter.total = len(entries)
        before = {t.role: t for t in previous or ()}
        rows: list[ToolSnap] = []
        changed: list[tuple[ToolSnap, str | None]] = []
        dropped = not before  # nothing known before: whatever the snapshot holds may be gone
        for counter.done, entry in enumerate(entries):
            old = before.get(entry.role)
            if old is not None and old.entry is not None and (old.entry is entry or old.entry == entry):
                rows.append(old)
                continue
            key, text = self.health.entry_key(entry)
            if old is not None and old.digest == key:
                rows.append(with_entry(old, entry))
                continue
            rows.append(tool_snap(entry, self.health.methods(entry), key))
            changed.append((rows[-1], text if text is not None else entry.model_dump_json()))
            dropped = dropped or old is None or bool({m.method for m in old.marks} - set(entry.methods))
        present = {t.role for t in rows}
        gone = [role for role in before if role not in present]
        # health rows of methods no longer listed are dropped (the set of every method: only when one may be gone)
        self.health.persist({(t.role, m.method) for t in rows for m in t.marks} if dropped or gone else None)
        if changed or gone or self._registry is not None:
            self._generation = self.boards.save(
                self._registry, self._generation, rows, changed, gone, self._summarized(rows)
            )
        return rows

    def _summarized(self, rows: list[ToolSnap]) -> Summary:
        """The summary of ``rows``, kept for :meth:`summary_ready` (once per rebuild: 10,000 rows take ~10 ms)."""
        self._made = (rows, summarize_board(rows))
        return self._made[1]

    def amend(self, shown: list[tuple[ToolSnap, RegistryEntry, list[MethodHealth]]]) -> None:
        """The rows a page showed, checked against their method files: a tool whose badges differ from the
        board's (a method file changed behind the store's back) is corrected here and in the persisted board."""
        snap = self._snapshot
        # a row whose entry changed since the board was read is left to the next rebuild
        fixed = [tool_snap(e, methods, t.digest) for t, e, methods in shown
                 if tuple(Mark(m.method, m.badge, m.recent_failure_rate) for m in methods) != t.marks
                 and self.health.entry_key(e)[0] == t.digest]  # fmt: skip
        if snap is None or not fixed:
            return
        by_role = {t.role: t for t in fixed}
        rows = [by_role.get(t.role, t) for t in snap[2]]
        self._snapshot = (snap[0], snap[1], rows)
        self.derived.clear()
        changed: list[tuple[ToolSnap, str | None]] = [(t, None) for t in fixed]
        self._generation = self.boards.save(self._registry, self._generation, rows, changed, [])

    def summary_ready(self, bound: float | None = None) -> Summary | HealthBuilding:
        """The Overview's counts: from the rows in memory, or (a fresh process that has not read them) the
        summary persisted with the board when it describes the registry as it is now; else the progress of the
        background build they need (see :meth:`tools_ready`)."""
        found = self._stored_summary()
        if found is not None:
            return found
        rows = self.tools_ready(bound)
        return rows if isinstance(rows, HealthBuilding) else self._summary_of(rows)

    def _stored_summary(self) -> Summary | None:
        if self._snapshot is None and not self._loaded:
            self.store.settle()
            version = self._version()
            kept = self._summary
            if kept is not None and version is not None and kept[0] == version and kept[1] > time.monotonic():
                return kept[2]
            found = self.boards.summary(version) if version is not None else None
            if found is None and version is not None:
                found, version = self._summary_since()
            if found is not None and version is not None:
                self._summary = (version, time.monotonic() + SNAPSHOT_S, found)
                return found
        return None

    def _summary_of(self, rows: list[ToolSnap]) -> Summary:
        if "summary" not in self.derived:
            made = self._made
            self.derived["summary"] = made[1] if made is not None and made[0] is rows else summarize_board(rows)
        result: Summary = self.derived["summary"]
        return result

    def _summary_since(self) -> tuple[Summary | None, str | None]:
        """A fresh process's Overview after other processes wrote: the saved summary with the rows of the entries
        written since computed again (their method files read, nothing else), saved with the board. ``(None,
        None)`` when that takes every row (another generation, or the summary cannot be updated alone)."""
        at = self.boards.version()
        delta = self.store.changed_since(at) if at is not None else None
        board = self.boards.rows_of([e.role for e in delta[1]], at) if delta is not None and at is not None else None
        if delta is None or board is None or at is None:
            return None, None
        old, stored = board
        version, entries = delta
        self.health.prefetch([(e.role, m) for e in entries for m in e.methods])
        changed: list[tuple[ToolSnap, str]] = []
        for entry in entries:
            key, text = self.health.entry_key(entry)
            changed.append((tool_snap(entry, self.health.methods(entry), key), text or entry.model_dump_json()))
        summary = stored.updated(old, [t for t, _ in changed])
        if summary is None or at is None:
            return None, None
        self.health.persist(None)
        self.boards.advance(at, version, changed, summary)
        return summary, version

    def entry(self, role: str) -> RegistryEntry | None:
        """One tool's registry entry: from the persisted board when it describes the registry as it is now, else
        from the store (one row: a fresh process's artifact page decodes no registry either way)."""
        version = self._version()
        found = self.boards.entry(role, version) if version is not None else None
        return found if found is not None else self.store.get_tool(role)

    def entries(self, snaps: list[ToolSnap]) -> list[tuple[ToolSnap, RegistryEntry]]:
        """``snaps`` with their registry entries (rows from the persisted board have none in memory; a tool
        gone from the registry meanwhile is left out)."""
        known = self._entries
        stored = self.boards.entries([t for t in snaps if t.entry is None and (t.role, t.digest) not in known])
        digests = {t.role: t.digest for t in snaps}
        known.update({(role, digests[role]): e for role, e in stored.items()})  # stored under that digest only
        self.health.prefetch([(t.role, m.method) for t in snaps for m in t.marks])
        out = []
        for t in snaps:
            entry = t.entry or known.get((t.role, t.digest)) or self.store.get_tool(t.role)
            if entry is not None:
                out.append((t, entry))
        return out

    def sorted_ready(
        self, sort: SortKey, descending: bool, bound: float | None = None
    ) -> list[ToolSnap] | HealthBuilding:
        """:meth:`tools` in one order, kept with the snapshot, or the progress of the background build they need
        (see :meth:`tools_ready`)."""
        rows = self.tools_ready(bound)
        return rows if isinstance(rows, HealthBuilding) else self._sorted(rows, sort, descending)

    def _sorted(self, rows: list[ToolSnap], sort: SortKey, descending: bool) -> list[ToolSnap]:
        key = ("sorted", sort, descending)
        if key not in self.derived:
            if sort == "role" and not descending:
                self.derived[key] = rows
            else:
                self.derived[key] = sorted(rows, key=lambda t: (_sort_value(sort, t), t.role), reverse=descending)
        result: list[ToolSnap] = self.derived[key]
        return result


# --- tools ---------------------------------------------------------------------------------------------


class ToolRow(BaseModel):
    role: str
    purpose: str | None
    deliverable: Any = None
    acceptance: Any = None
    failure_policy: Any = None
    badge: Badge
    methods: list[MethodHealth]
    usage_count: int
    success_count: int
    failure_count: int
    intrinsic_failure_count: int
    extrinsic_failure_count: int
    adaptive_failure_count: int
    recent_failure_rate: float = Field(description="the highest of its methods'")
    repairs_since_regeneration: int = Field(description="summed over its methods")
    prompt_version_match: bool | None = Field(description="False if any method's prompt version differs")
    last_used_at: datetime | None


class ToolsPage(BaseModel):
    tenant: str
    total: int
    matched: int
    page: int
    pages: int
    sort: SortKey
    descending: bool
    q: str | None
    badge: Badge | None
    badge_counts: dict[str, int]
    tools: list[ToolRow]
    health_building: HealthBuilding | None = Field(
        default=None, description="set while the tools' health is computed for the first time (no tool listed)"
    )


def _tool_row(entry: RegistryEntry, methods: list[MethodHealth]) -> ToolRow:
    matches = [m.prompt_version_match for m in methods if m.prompt_version_match is not None]
    return ToolRow(
        role=entry.role, purpose=entry.purpose, deliverable=entry.deliverable, acceptance=entry.acceptance,
        failure_policy=entry.failure_policy, badge=worst([m.badge for m in methods]), methods=methods,
        usage_count=entry.usage_count, success_count=entry.success_count, failure_count=entry.failure_count,
        intrinsic_failure_count=sum(m.intrinsic_failure_count for m in methods),
        extrinsic_failure_count=sum(m.extrinsic_failure_count for m in methods),
        adaptive_failure_count=sum(m.adaptive_failure_count for m in methods),
        recent_failure_rate=max((m.recent_failure_rate for m in methods), default=0.0),
        repairs_since_regeneration=sum(m.repairs_since_regeneration for m in methods),
        prompt_version_match=all(matches) if matches else None, last_used_at=entry.last_used_at,
    )  # fmt: skip


def _sort_value(sort: SortKey, t: ToolSnap) -> Any:
    if sort == "usage":
        return t.usage_count
    if sort == "failures":
        return t.failure_count
    if sort == "failure_rate":
        return t.rate
    if sort == "last_used":
        return t.activity
    if sort == "badge":
        return BADGE_ORDER.index(t.badge)
    return t.role


def tools_page(
    board: Board, *, page: int = 1, sort: SortKey = "role", descending: bool = False, q: str | None = None,
    badge: Badge | None = None,
) -> ToolsPage:  # fmt: skip
    """Every tool, filtered by a text in its role or purpose and by badge, sorted, one page of them."""
    entries = board.sorted_ready(sort, descending)
    if isinstance(entries, HealthBuilding):
        return ToolsPage(
            tenant=board.tenant, total=entries.total or 0, matched=0, page=1, pages=1, sort=sort, descending=descending,
            q=q, badge=badge, badge_counts={}, tools=[], health_building=entries,
        )  # fmt: skip
    counts = dict.fromkeys(BADGE_ORDER, 0)
    for t in entries:
        counts[t.badge] += 1
    needle = q.lower() if q else None
    keyed = [
        t for t in entries
        if (badge is None or t.badge == badge)
        and (not needle or needle in t.role.lower() or needle in (t.purpose or "").lower())
    ] if badge is not None or needle else entries  # fmt: skip
    pages = max(1, -(-len(keyed) // PAGE_SIZE))
    page = min(max(1, page), pages)
    shown = [(t, e, board.health.methods(e, verify=True)) for t, e in board.entries(
        keyed[(page - 1) * PAGE_SIZE : page * PAGE_SIZE])]  # fmt: skip
    board.amend(shown)
    return ToolsPage(
        tenant=board.tenant, total=len(entries), matched=len(keyed), page=page, pages=pages, sort=sort,
        descending=descending, q=q, badge=badge, badge_counts=counts, tools=[_tool_row(e, m) for _, e, m in shown],
    )  # fmt: skip


# --- artifact ------------------------------------------------------------------------------------------


class Evidence(BaseModel):
    line: int
    column: int
    source: str = Field(description="the construct that shows the capability")


class CapabilityView(BaseModel):
    tag: str
    granted: bool
    evidence: list[Evidence]


class GenerationView(BaseModel):
    generation: int
    current: bool
    created_at: datetime
    program_source: str
    model: str | None
    prompt_version: str | None
    success_count: int
    failure_count: int
    checksum_ok: bool
    lines: int


class DiffLine(BaseModel):
    kind: Literal["context", "add", "remove", "hunk", "header"]
    text: str


class ArtifactPage(BaseModel):
    tenant: str
    role: str
    method: str
    health: MethodHealth
    generation: int
    code: str
    capabilities: list[CapabilityView]
    verdict: str = Field(description="the tenant's policy on the current code, now")
    cacheable: bool | None
    cacheability_reason: str | None
    input_sensitive: bool
    dependencies: list[str]
    environment: dict[str, Any] | None
    generations: list[GenerationView]
    diff_from: int | None
    diff_to: int | None
    diff: list[DiffLine]
    rollback_targets: list[int]


def _diff(old: MethodArtifact, new: MethodArtifact) -> list[DiffLine]:
    out: list[DiffLine] = []
    lines = difflib.unified_diff(
        old.code.splitlines(), new.code.splitlines(), f"generation {old.generation}", f"generation {new.generation}",
        lineterm="",
    )  # fmt: skip
    for line in lines:
        if line.startswith(("---", "+++")):
            kind: Literal["context", "add", "remove", "hunk", "header"] = "header"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "remove"
        else:
            kind = "context"
        out.append(DiffLine(kind=kind, text=line))
    return out


def _generation(art: MethodArtifact, current: bool) -> GenerationView:
    return GenerationView(
        generation=art.generation, current=current, created_at=art.created_at, program_source=art.program_source.value,
        model=art.model, prompt_version=art.prompt_version, success_count=art.success_count,
        failure_count=art.failure_count, checksum_ok=art.checksum_ok(), lines=len(art.code.splitlines()),
    )  # fmt: skip


def artifact_page(
    board: Board, role: str, method: str, *, a: int | None = None, b: int | None = None
) -> ArtifactPage | None:
    """One method's current artifact, its retained generations and the diff between two of them (default:
    the previous generation against the current one). None when there is no such artifact."""
    board.store.settle()
    entry = board.entry(role)
    board.health.prefetch([(role, method)])
    gens = board.store.history(role, method)
    if entry is None or not gens:
        return None
    current = gens[0]
    by_number = {g.generation: g for g in gens}
    old: MethodArtifact | None
    new: MethodArtifact | None
    if a is None and b is not None and b != current.generation:
        old, new = current, by_number.get(b)  # "what would change": the current code against generation b
    else:
        old = by_number.get(a) if a is not None else (gens[1] if len(gens) > 1 else None)
        new = by_number.get(b) if b is not None else current
    diff = _diff(old, new) if old is not None and new is not None else []
    verdict = validate(current.code, board.policy)
    caps = [
        CapabilityView(tag=c.tag, granted=c.granted,
                       evidence=[Evidence(line=e.line, column=e.column, source=e.construct) for e in c.evidence])
        for c in verdict.capabilities
    ]  # fmt: skip
    return ArtifactPage(
        tenant=board.tenant, role=role, method=method, health=board.health.method(entry, method),
        generation=current.generation, code=current.code, capabilities=caps, verdict=verdict.verdict,
        cacheable=current.cacheable, cacheability_reason=current.cacheability_reason,
        input_sensitive=current.input_sensitive, dependencies=current.dependencies,
        environment=current.environment.model_dump(mode="json") if current.environment else None,
        generations=[_generation(g, i == 0) for i, g in enumerate(gens)],
        diff_from=old.generation if old else None, diff_to=new.generation if new else None, diff=diff,
        rollback_targets=[g.generation for g in gens[1:] if g.checksum_ok()],
    )  # fmt: skip


# --- calls ---------------------------------------------------------------------------------------------


class Indexing(BaseModel):
    """The call-log index is being built (a large log met for the first time): the page shows the records
    indexed so far, the oldest first, and says so."""

    indexed_records: int
    estimated_records: int = Field(description="the whole log's, from the mean record length so far")
    indexed_bytes: int
    log_bytes: int


def indexing(board: Board) -> Indexing | None:
    """What the index still lacks, or None when it has caught up (a short tail is indexed by the read)."""
    p = board.calls.progress()
    if not p.building and p.log_bytes - p.indexed_bytes <= board.calls.inline_bytes:
        return None
    return Indexing(indexed_records=p.indexed_records, estimated_records=p.estimated_records,
                    indexed_bytes=p.indexed_bytes, log_bytes=p.log_bytes)  # fmt: skip


#: who asks for a call: agent, cli, http, mcp (the calls page's source filter)
CALL_SOURCES: tuple[str, ...] = get_args(CallSource)


class CallRow(BaseModel):
    id: int
    call_id: str
    trace_id: str
    parent_call_id: str | None
    depth: int
    started_at: datetime
    role: str
    method: str
    status: str
    error_type: str | None
    failure_stage: str | None
    failure_class: str | None
    duration_s: float
    attempts: int
    security_events: int = Field(0, description="executions of this call that ended on a security event (issue 36)")
    source: str = Field("agent", description="who asked: agent, or a run's cli, http or mcp (issue 37)")


class CallsPage(BaseModel):
    tenant: str
    filters: dict[str, str | None]
    calls: list[CallRow]
    next_before: int | None = Field(description="pass as `before` for the next (older) page")
    indexed: int = Field(description="call records in the index")
    indexing: Indexing | None = Field(default=None, description="set while the index is being built")


def _call_row(c: IndexedCall) -> CallRow:
    return CallRow(
        id=c.id, call_id=c.call_id, trace_id=c.trace, parent_call_id=c.parent, depth=c.depth, started_at=_utc(c.t),
        role=c.role, method=c.method, status=c.status, error_type=c.error_type, failure_stage=c.stage,
        failure_class=c.failure_class, duration_s=c.duration, attempts=c.attempts, security_events=c.security,
        source=c.source,
    )  # fmt: skip


def calls_page(board: Board, flt: CallFilter, *, limit: int = PAGE_SIZE) -> CallsPage:
    rows = board.calls.page(flt, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    filters = {
        "role": flt.role, "method": flt.method, "status": flt.status, "stage": flt.stage, "trace": flt.trace,
        "since": _utc(flt.since).isoformat() if flt.since is not None else None,
        "until": _utc(flt.until).isoformat() if flt.until is not None else None,
        "security": "1" if flt.security else None, "source": flt.source,
    }  # fmt: skip
    return CallsPage(
        tenant=board.tenant, filters=filters, calls=[_call_row(r) for r in rows],
        next_before=rows[-1].id if more and rows else None, indexed=board.calls.total(), indexing=indexing(board),
    )  # fmt: skip


class TreeNode(BaseModel):
    call: CallRow
    children: list[TreeNode] = Field(default_factory=list)


class StageDurations(BaseModel):
    total_s: float
    sandbox_s: float = Field(description="the last attempt's execution in the sandbox")
    all_attempts_sandbox_s: float
    nested_calls_s: float = Field(description="waiting for nested calls")
    fetches_s: float = Field(description="waiting for the host's fetches")
    environment_prepare_s: float | None
    other_s: float = Field(description="generation, validation, commit and the rest")


class CallPage(BaseModel):
    tenant: str
    record: dict[str, Any]
    durations: StageDurations
    tree: TreeNode | None
    protections: list[str] = Field(description="what this server requires every sandbox to show before use")
    protections_waived: list[str]
    indexing: Indexing | None = Field(default=None, description="set while the index is being built")


def _tree(rows: list[IndexedCall]) -> TreeNode | None:
    nodes = {r.call_id: TreeNode(call=_call_row(r)) for r in rows}
    root: TreeNode | None = None
    for r in rows:
        node = nodes[r.call_id]
        parent = nodes.get(r.parent) if r.parent else None
        if parent is not None:
            parent.children.append(node)
        elif r.depth == 0:
            root = node
    return root


def _durations(rec: CallRecord) -> StageDurations:
    u = rec.usage
    env = rec.env_prepare_ms / 1000 if rec.env_prepare_ms is not None else None
    other = rec.duration_s - u.total_sandbox_duration_s - u.bridge_duration_s - u.fetch_duration_s - (env or 0.0)
    return StageDurations(
        total_s=rec.duration_s, sandbox_s=u.sandbox_duration_s, all_attempts_sandbox_s=u.total_sandbox_duration_s,
        nested_calls_s=u.bridge_duration_s, fetches_s=u.fetch_duration_s, environment_prepare_s=env,
        other_s=max(0.0, other),
    )  # fmt: skip


def call_page(board: Board, call_id: str) -> CallPage | None:
    row = board.calls.find(call_id)
    rec = board.calls.record(row) if row is not None else None
    if row is None or rec is None:
        return None
    return CallPage(
        tenant=board.tenant, record=rec.model_dump(mode="json"), durations=_durations(rec),
        tree=_tree(board.calls.trace(rec.trace_id)),
        protections=[str(p) for p in board.sandbox.enforced_protections],
        protections_waived=[str(p) for p in board.sandbox.waived_protections], indexing=indexing(board),
    )  # fmt: skip


# --- security events (issue 36) ------------------------------------------------------------------------


#: where a security event comes from: tripwire, inner_wall, host (the security page's source filter)
SECURITY_SOURCES: tuple[str, ...] = get_args(SecurityEvent.model_fields["source"].annotation)


class SecurityEventRow(BaseModel):
    """One execution that ended on a security event, with where it happened and the call that holds it."""

    id: int
    at: datetime
    tenant: str
    role: str = Field(description="the tool whose program caused it")
    method: str
    attempt: int
    attempt_id: str | None
    source: str = Field(description="tripwire, inner_wall or host")
    event: str
    detail: str
    call_id: str = Field(description="the call whose record holds it (a discarded nested call's parent)")
    trace_id: str
    status: str = Field(description="how that call ended")


class SecurityPage(BaseModel):
    tenant: str
    filters: dict[str, str | None]
    sources: list[str] = Field(
        default_factory=lambda: list(SECURITY_SOURCES), description="the source filter's choices"
    )
    events: list[SecurityEventRow]
    next_before: int | None = Field(description="pass as `before` for the next (older) page")
    indexed: int = Field(description="security events in the index")
    indexing: Indexing | None = Field(default=None, description="set while the index is being built")


def _security_row(board: Board, row: IndexedSecurityEvent) -> SecurityEventRow:
    """The indexed event with what only its record holds (detail, the tool for a discarded nested call's)."""
    record = board.calls.record(row.call)
    entries = record.security_events if record is not None else []
    entry: CallSecurityEvent | None = entries[row.n] if row.n < len(entries) else None
    return SecurityEventRow(
        id=row.id, at=_utc(row.t), tenant=board.tenant, role=entry.role if entry else row.call.role,
        method=entry.method if entry else row.call.method, attempt=row.attempt,
        attempt_id=entry.attempt_id if entry else None, source=row.source, event=row.event,
        detail=entry.detail if entry else "", call_id=row.call.call_id, trace_id=row.call.trace,
        status=row.call.status,
    )  # fmt: skip


def security_page(board: Board, flt: SecurityFilter, *, limit: int = PAGE_SIZE) -> SecurityPage:
    """Every security event of the tenant's calls, newest first (each a link to its call)."""
    rows = board.calls.security_events(flt, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    filters = {"source": flt.source, "event": flt.event,
               "since": _utc(flt.since).isoformat() if flt.since is not None else None}  # fmt: skip
    return SecurityPage(
        tenant=board.tenant, filters=filters, events=[_security_row(board, r) for r in rows],
        next_before=rows[-1].id if more and rows else None, indexed=board.calls.security_total(),
        indexing=indexing(board),
    )  # fmt: skip


# --- overview ------------------------------------------------------------------------------------------


class HourPoint(BaseModel):
    hour: datetime
    calls: int
    failures: int
    answered: int = Field(0, description="calls the program answered with its own Outcome.error (not failures)")


class Flagged(BaseModel):
    role: str
    method: str
    badge: Badge
    recent_failure_rate: float


class OverviewPage(BaseModel):
    tenant: str
    tools: int | None = Field(description="None while the tools' health is computed and the registry not yet read")
    artifacts: int | None = Field(description="None while the tools' health is computed")
    calls_last_hour: int
    failures_last_hour: int
    calls_last_day: int
    failures_last_day: int
    answered_last_hour: int = Field(description="calls answered with the program's own Outcome.error, last hour")
    answered_last_day: int = Field(description="calls answered with the program's own Outcome.error, last 24 h")
    error_rate_last_day: float = Field(description="failures / calls: answers with an error are not failures")
    badge_counts: dict[str, int] = Field(description="methods per badge")
    flagged: list[Flagged] = Field(description="degraded or stale methods (the first 20)")
    flagged_total: int | None = Field(description="None while the tools' health is computed")
    top_failure_types: list[tuple[str, int]] = Field(description="last 24 hours")
    top_answer_types: list[tuple[str, int]] = Field(description="error types programs answered with, last 24 h")
    chart: list[HourPoint] = Field(description="calls, failures and answers with an error per hour, the last 24 h")
    indexed_calls: int
    indexing: Indexing | None = Field(default=None, description="set while the index is being built")
    health_building: HealthBuilding | None = Field(
        default=None, description="set while the tools' health is computed for the first time (no health shown)"
    )


def _health_part(summary: Summary | HealthBuilding) -> dict[str, Any]:
    """The Overview's fields that come from the tools' health (unknown while it is computed)."""
    if isinstance(summary, HealthBuilding):
        return {"tools": summary.total, "artifacts": None, "badge_counts": {}, "flagged_total": None,
                "flagged": [], "health_building": summary}  # fmt: skip
    return {
        "tools": summary.tools, "artifacts": summary.artifacts, "badge_counts": summary.counts,
        "flagged_total": summary.flagged_total,
        "flagged": [Flagged(role=r, method=m.method, badge=m.badge, recent_failure_rate=m.rate)
                    for r, m in summary.flagged],
    }  # fmt: skip


def overview_page(board: Board, *, now: float | None = None) -> OverviewPage:
    now = time.time() if now is None else now
    summary = board.summary_ready()
    hour_calls, hour_failures, hour_answered = board.calls.count_since(now - 3600)
    first = int(now // 3600) - 23
    per_hour: dict[int, list[int]] = {h: [0, 0, 0] for h in range(first, first + 24)}
    failure_types: dict[str, int] = {}
    answer_types: dict[str, int] = {}
    for hour, error_type, answer, n in board.calls.hourly(first):
        slot = per_hour.setdefault(hour, [0, 0, 0])
        slot[0] += n
        if error_type:  # an answer with an error is counted apart from failures (ADR 0012, issue 37)
            slot[2 if answer else 1] += n
            kinds = answer_types if answer else failure_types
            kinds[error_type] = kinds.get(error_type, 0) + n
    day_calls = sum(v[0] for v in per_hour.values())
    day_failures = sum(v[1] for v in per_hour.values())
    return OverviewPage(
        tenant=board.tenant, calls_last_hour=hour_calls,
        failures_last_hour=hour_failures, calls_last_day=day_calls, failures_last_day=day_failures,
        answered_last_hour=hour_answered, answered_last_day=sum(v[2] for v in per_hour.values()),
        error_rate_last_day=round(day_failures / day_calls, 4) if day_calls else 0.0, **_health_part(summary),
        top_failure_types=sorted(failure_types.items(), key=lambda kv: (-kv[1], kv[0]))[:8],
        top_answer_types=sorted(answer_types.items(), key=lambda kv: (-kv[1], kv[0]))[:8],
        chart=[HourPoint(hour=_utc(h * 3600), calls=c, failures=f, answered=a)
               for h, (c, f, a) in sorted(per_hour.items())],
        indexed_calls=board.calls.total(), indexing=indexing(board),
    )  # fmt: skip


# --- patterns ------------------------------------------------------------------------------------------


class MethodPatterns(BaseModel):
    method: str
    calls_in_window: int
    counts: list[tuple[str, int]]
    promotion_candidate: bool
    promotion_capabilities: list[str]
    recent_patterns_block: str | None = Field(description="the <recent_patterns> block as the model sees it")


class RolePatternsView(BaseModel):
    role: str
    events: int
    last_event_at: datetime | None
    methods: list[MethodPatterns]


class PatternsPage(BaseModel):
    tenant: str
    total_roles: int
    page: int
    pages: int
    roles: list[RolePatternsView]


def _index_without(index: dict[str, list[str]], role: str, labels: list[str]) -> dict[str, list[str]]:
    """The capability index as the store shows it to ``role`` (its own tools left out), for ``labels`` only."""
    return {label: [r for r in index.get(label, ()) if r != role] for label in labels}


def _role_patterns(
    store: ToolStore, role: str, events: list[PatternEvent], index: dict[str, list[str]]
) -> RolePatternsView:
    methods: list[MethodPatterns] = []
    for method in sorted({e.method_name for e in events}):
        summary = summarize(role, events, method_name=method, window=DEFAULT_SUMMARY_WINDOW)
        tools = _index_without(index, role, [c.label for c in summary.counts])
        signal = promotion_signal(summary, tools, threshold=DEFAULT_PROMOTION_THRESHOLD)
        block = render_recent_patterns(summary, depth=0, tool_index=tools, dynamic_methods=store.policy.dynamic_methods)
        methods.append(MethodPatterns(
            method=method, calls_in_window=summary.calls, counts=[(c.label, c.count) for c in summary.counts],
            promotion_candidate=signal.detected, promotion_capabilities=signal.capabilities,
            recent_patterns_block=block,
        ))  # fmt: skip
    return RolePatternsView(role=role, events=len(events), last_event_at=events[-1].timestamp if events else None,
                            methods=methods)  # fmt: skip


def patterns_page(board: Board, *, page: int = 1) -> PatternsPage:
    """Pattern memory per role, 50 roles a page: the summary the prompt is built from (the store's window),
    promotion candidates, and the ``<recent_patterns>`` block as the model sees it (dynamic methods only)."""
    memory = board.store.patterns.roles_events()
    roles = sorted(memory)
    pages = max(1, -(-len(roles) // PAGE_SIZE))
    page = min(max(1, page), pages)
    chunk = roles[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    rows = board.tools_ready()
    if isinstance(rows, HealthBuilding):  # no health needed here: the registry's own capabilities, not waited for
        index = board.store.capability_index()
    else:  # the board's rows (a fresh process's persisted board: the registry is not decoded)
        index = {}
        for t in rows:
            for cap in t.capabilities:
                index.setdefault(cap, []).append(t.role)
    return PatternsPage(tenant=board.tenant, total_roles=len(roles), page=page, pages=pages,
                        roles=[_role_patterns(board.store, r, memory[r], index) for r in chunk])  # fmt: skip
