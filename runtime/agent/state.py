"""Transactional attempt state (ADR 0016 section 3): context, tool registry and telemetry, staged per attempt.

A :class:`Transaction` is one attempt's private view. Reads fall through to the parent transaction (the
attempt of the calling program, for a nested call) and finally to the committed :class:`State`; writes
stay in the transaction. ``commit`` merges them one level up (into the parent attempt, or into the
committed state for a top-level attempt); ``rollback`` throws them away. So a nested call made by an
attempt that later fails leaves nothing behind, however deep it went.

v1 isolation is a full snapshot per attempt (ADR 0016, open question 1). Contexts are kept as immutable
:class:`~sandbox.context.ContextSnapshot` objects (each key's JSON text), so an attempt's view costs nothing
to take, a failed attempt cannot have touched the committed one, and a key no program changed is never
re-encoded or re-decoded between calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sandforge.runtime.agent.awaited import commit_window
from sandforge.runtime.agent.calllog import CallRecord, NestedCallSummary
from sandforge.runtime.agent.source import ProgramCandidate, ProgramPlan
from sandforge.runtime.agent.statedb import Committed, StateDB, etags
from sandforge.runtime.store.models import ToolContract as ToolContract  # the one contract model, re-exported
from sandforge.sandbox.context import ContextSnapshot

JsonDict = dict[str, Any]


@dataclass
class StagedRecord:
    record: CallRecord
    #: the program of the call's last attempt, for the store hook
    candidate: ProgramCandidate | None = None
    #: the store's plan for the call, if it gave one
    plan: ProgramPlan | None = None


class CommitConflict(Exception):
    """A top-level attempt would overwrite a context another call committed after this attempt read it
    (``runtime.agent.callgate``): nothing was committed; the call runs again."""

    def __init__(self, roles: list[str]) -> None:
        super().__init__(f"the context of {', '.join(roles)} changed while the call ran")
        self.roles = roles


class State:
    """What is committed: each role's context and the tool registry. Guarded by one lock.

    ``versions`` counts the commits of each role's context; a top-level transaction remembers the version of
    each context it read and commits only if those it writes are unchanged (:class:`CommitConflict`), unless
    its thread is ``unchecked`` (a call running alone after a conflict).

    With ``db`` (a :class:`~runtime.agent.statedb.StateDB`) the contexts live there: ``contexts`` and
    ``versions`` are this process's cache of it, dropped whenever another process committed, and a commit
    is checked and written in the database's transaction, with the records of its calls. Other processes'
    commits are never ``unchecked`` away: a conflict with one is refused even for a call running alone."""

    def __init__(
        self,
        on_records: Callable[[list[StagedRecord]], None],
        on_tools: Callable[[dict[str, ToolContract]], None] | None = None,
        db: StateDB | None = None,
    ) -> None:
        self.db = db
        #: roles whose entry in ``contexts``/``versions`` was read from ``db`` since it last changed elsewhere
        self._loaded: set[str] = set()
        self.contexts: dict[str, ContextSnapshot] = {}
        #: role -> key -> (the key's text, its prompt preview): previews are made once per text, not per call
        self.previews: dict[str, dict[str, tuple[bytes, str]]] = {}
        self.tools: dict[str, ToolContract] = {}
        self.versions: dict[str, int] = {}
        self.unchecked = threading.local()
        self.lock = threading.RLock()
        self._on_records = on_records
        self._on_tools = on_tools

    def read(self, role: str) -> Committed:
        """The committed context of ``role`` and its version (the caller holds ``lock``)."""
        if self.db is not None:
            if self.db.changed():  # another process committed: everything cached may be stale
                self._loaded.clear()
            if role not in self._loaded:
                committed = self.db.read(role)
                self.contexts[role] = committed.snapshot
                self.versions[role] = committed.version
                self._loaded.add(role)
        return Committed(self.versions.get(role, 0), self.contexts.get(role) or ContextSnapshot())

    def commit(self, contexts: dict[str, ContextSnapshot], bases: dict[str, int], records: list[StagedRecord]) -> None:
        """Commit ``contexts`` (with ``records``, when durable) or raise CommitConflict keeping nothing (the
        caller holds ``lock``)."""
        if self.db is None:
            conflicts = self.conflicts(contexts, bases)
            if conflicts:
                raise CommitConflict(conflicts)
            self.contexts.update(contexts)
            self.changed(contexts)
            return
        rows = [(s.record.call_id, s.record.trace_id, s.record.role, s.record.method, s.record.status,
                 s.record.model_dump_json()) for s in records]  # fmt: skip
        conflicts, versions = self.db.commit(contexts, bases, rows)
        if conflicts:
            self._loaded.difference_update(conflicts)  # the re-run reads what the other writer committed
            raise CommitConflict(conflicts)
        self.contexts.update(contexts)
        self.versions.update(versions)
        self._loaded.update(versions)

    def replace(self, role: str, snapshot: ContextSnapshot, if_match: str | None = None) -> tuple[Committed, bool]:
        """Set ``role``'s context unless ``if_match`` is given and is not its entity tag: ``(now, written)``."""
        with self.lock:
            if self.db is None:
                now = self.read(role)
                if if_match is not None and if_match.strip() != "*" and now.etag not in etags(if_match):
                    return now, False
                self.contexts[role] = snapshot
                self.changed([role])
                return self.read(role), True
            now, written = self.db.replace(role, snapshot, if_match)
            self.contexts[role] = now.snapshot
            self.versions[role] = now.version
            self._loaded.add(role)
            return now, written

    def changed(self, roles: Iterable[str]) -> None:
        """Count a commit of each of ``roles``' contexts (the caller holds ``lock``)."""
        for role in roles:
            self.versions[role] = self.versions.get(role, 0) + 1

    def conflicts(self, written: Iterable[str], bases: dict[str, int]) -> list[str]:
        """Roles among ``written`` committed since they were read at version ``bases[role]`` (caller holds ``lock``)."""
        if getattr(self.unchecked, "on", False):
            return []
        return [r for r in written if r in bases and self.versions.get(r, 0) != bases[r]]

    def emit(self, staged: list[StagedRecord]) -> None:
        if staged:
            self._on_records(staged)

    def emit_tools(self, tools: dict[str, ToolContract]) -> None:
        """Contracts a top-level attempt just committed (for the store's registry)."""
        if tools and self._on_tools is not None:
            self._on_tools(dict(tools))


@dataclass
class Transaction:
    state: State
    parent: Transaction | None = None
    contexts: dict[str, ContextSnapshot] = field(default_factory=dict)
    tools: dict[str, ToolContract] = field(default_factory=dict)
    records: list[StagedRecord] = field(default_factory=list)
    closed: bool = False
    #: top-level transactions: the version of each committed context read (checked at commit)
    bases: dict[str, int] = field(default_factory=dict)

    # --- reads (fall through to the parent, then to the committed state) ---

    def _visible_context(self, role: str) -> ContextSnapshot | None:
        if role in self.contexts:
            return self.contexts[role]
        if self.parent is not None:
            return self.parent._visible_context(role)
        with self.state.lock:
            committed = self.state.read(role)
            self.bases.setdefault(role, committed.version)
            return committed.snapshot or None

    def snapshot(self, role: str) -> ContextSnapshot:
        """The role's context as this attempt sees it (immutable: nothing to copy)."""
        return self._visible_context(role) or ContextSnapshot()

    def context(self, role: str) -> JsonDict:
        """A private decoded copy of the role's context as this attempt sees it."""
        return self.snapshot(role).to_dict()

    def contract(self, role: str) -> ToolContract | None:
        if role in self.tools:
            return self.tools[role]
        if self.parent is not None:
            return self.parent.contract(role)
        with self.state.lock:
            return self.state.tools.get(role)

    def all_tools(self) -> dict[str, ToolContract]:
        if self.parent is not None:
            merged = self.parent.all_tools()
        else:
            with self.state.lock:
                merged = dict(self.state.tools)
        merged.update(self.tools)
        return merged

    # --- staged writes ---

    def set_context(self, role: str, context: ContextSnapshot | JsonDict) -> None:
        self._check_open()
        self.contexts[role] = ContextSnapshot.from_dict(context)

    def register(self, contract: ToolContract) -> None:
        self._check_open()
        self.tools[contract.role] = contract

    def stage_record(
        self, record: CallRecord, candidate: ProgramCandidate | None = None, plan: ProgramPlan | None = None
    ) -> None:
        self._check_open()
        self.records.append(StagedRecord(record, candidate, plan))

    # --- end of the attempt ---

    def commit(self) -> None:
        """Merge everything staged one level up: the parent attempt, or the committed state (CommitConflict,
        with nothing kept, when a context this top-level attempt writes changed since it read it)."""
        self._check_open()
        self.closed = True
        if self.parent is not None:
            self.parent.contexts.update(self.contexts)
            self.parent.tools.update(self.tools)
            self.parent.records.extend(self.records)
            return
        with commit_window(), self.state.lock:  # refused once an awaiting task was cancelled (awaited.py)
            try:
                self.state.commit(self.contexts, self.bases, self.records)
            except CommitConflict:  # nothing is kept: the call runs again (runtime.agent.callgate)
                self.closed = False
                self.rollback()
                raise
            self.state.tools.update(self.tools)
        self.state.emit_tools(self.tools)
        self.state.emit(self.records)

    def rollback(self) -> list[NestedCallSummary]:
        """Discard everything staged; returns what the discarded nested calls were, for diagnostics."""
        if self.closed:
            return []
        self.closed = True
        discarded = [
            NestedCallSummary(
                call_id=s.record.call_id, role=s.record.role, method=s.record.method,
                status=s.record.status, error_type=s.record.error_type, security_events=s.record.security_events,
            )
            for s in self.records
        ]  # fmt: skip
        self.contexts.clear()
        self.tools.clear()
        self.records.clear()
        return discarded

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this attempt's transaction is already committed or rolled back")
