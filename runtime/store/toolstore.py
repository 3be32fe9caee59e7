"""The ToolStore: cross-session registry, method artifacts, health, retention, pattern memory.

One store is one directory (see ``runtime.store.paths``). Any number of processes may use it at once:
readers take no lock (every file write is an atomic rename; the registry's rows are read in SQLite's WAL read
snapshots, ``runtime.store.registry_db``), writers serialize on ``tools/.store.lock`` and re-read under the
lock, so no update is lost (read-modify-write is never done on a stale copy).

Corrupt or unreadable files are quarantined (``<name>.corrupt-<timestamp>``) and the run goes on:
a corrupt method file reads as "corrupt" (selection says GENERATE), a corrupt registry is rebuilt from
the role directories, a corrupt manifest from the method files, corrupt pattern memory starts empty.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from sandforge.runtime.files import make_dirs
from sandforge.runtime.store import record_files
from sandforge.runtime.store.cacheability import is_dynamic_method
from sandforge.runtime.store.errors import RollbackError, StoreIOError, ToolNotFoundError
from sandforge.runtime.store.health import ArtifactCandidate, apply_failure, apply_success, promote
from sandforge.runtime.store.known_tools import DEFAULT_TOP_N, rank_known_tools, render_known_tools
from sandforge.runtime.store.migrations import MANIFEST, METHOD, REGISTRY
from sandforge.runtime.store.models import (
    ARTIFACT_SCHEMA_VERSION,
    MANIFEST_SCHEMA_VERSION,
    REGISTRY_SCHEMA_VERSION,
    RETAINED_PREVIOUS,
    FailureClass,
    MethodArtifact,
    MethodFile,
    ProgramSource,
    RegistryEntry,
    RegistryFile,
    RoleManifest,
    ToolContract,
)
from sandforge.runtime.store.paths import StorePaths, check_name, safe_component
from sandforge.runtime.store.patterns import (
    DEFAULT_PROMOTION_THRESHOLD,
    DEFAULT_SUMMARY_WINDOW,
    DEFAULT_WINDOW_CAP,
    PatternMemory,
    PromotionSignal,
    promotion_signal,
    render_recent_patterns,
)
from sandforge.runtime.store.registry_db import CorruptRegistry, RegistryDB, registry_of
from sandforge.runtime.store.registry_db import Snapshot as RegistrySnapshot
from sandforge.runtime.store.registry_db import Version as RegistryVersion
from sandforge.runtime.store.selection import (
    CORRUPT,
    DEFAULT_POLICY,
    HealthStatus,
    Selection,
    SelectionPolicy,
    StoredArtifact,
    assess_health,
    reuse_allowed,
    select_artifact,
)

log = logging.getLogger(__name__)


class _Flushable(Protocol):
    def flush(self) -> None: ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LookupStatus(StrEnum):
    FOUND = "found"
    MISSING = "missing"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class ArtifactLookup:
    """What the store holds for ``(role, method_name)``. A corrupt file has already been quarantined."""

    role: str
    method_name: str
    status: LookupStatus
    file: MethodFile | None = None
    reason: str = ""
    quarantined_to: Path | None = None

    @property
    def artifact(self) -> MethodArtifact | None:
        return self.file.current if self.file is not None else None

    @property
    def stored(self) -> StoredArtifact:
        """The argument :func:`~runtime.store.selection.select_artifact` expects."""
        if self.status is LookupStatus.CORRUPT:
            return CORRUPT
        return self.artifact


class ArtifactHealth(BaseModel):
    """One row of ``sandforge tools health``."""

    model_config = ConfigDict(frozen=True)

    role: str
    method_name: str
    status: LookupStatus
    generation: int | None = None
    health: HealthStatus | None = None
    checksum_ok: bool | None = None
    reusable: bool | None = None
    reuse_reason: str = ""
    artifact: MethodArtifact | None = None


class PruneCandidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: str
    dir_name: str
    last_activity: datetime
    usage_count: int
    methods: list[str]


class PrunePlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    cutoff: datetime
    applied: bool
    archive_dir: str | None = None
    candidates: list[PruneCandidate]


def _check_registry(reg: RegistryFile) -> str | None:
    for key, entry in reg.tools.items():
        if key != entry.role:
            return f"registry key {key!r} holds the entry of role {entry.role!r}"
    return None


def _check_method_file(role: str, method_name: str) -> Callable[[MethodFile], str | None]:
    def check(mf: MethodFile) -> str | None:
        if mf.role != role or mf.method_name != method_name:
            return f"file holds {mf.role!r}.{mf.method_name!r}, expected {role!r}.{method_name!r}"
        generations = [a.generation for a in mf.generations()]
        if len(set(generations)) != len(generations) or max(generations) >= mf.next_generation:
            return "generation numbers are inconsistent"
        for a in mf.generations():
            if a.role != role or a.method_name != method_name:
                return "an artifact in the file belongs to another method"
        return None

    return check


def _check_manifest(role: str) -> Callable[[RoleManifest], str | None]:
    def check(m: RoleManifest) -> str | None:
        return None if m.role == role else f"manifest of role {m.role!r} in the directory of {role!r}"

    return check


def _keep(entry: RegistryEntry) -> Callable[[RegistryEntry | None], RegistryEntry]:
    """A row change that writes ``entry`` whatever is stored."""
    return lambda _: entry


def _activity(entry: RegistryEntry) -> datetime:
    return entry.last_used_at or entry.created_at


class ToolStore:
    """Registry (contracts), method artifacts (code + health), pattern memory. See docs/toolstore.md.

    ``state_dir`` defaults to ``$SANDFORGE_STATE_DIR`` or the user state directory; the store is its
    ``tools/`` subdirectory. Nothing is created until the first write.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        policy: SelectionPolicy = DEFAULT_POLICY,
        lock_timeout: float = 30.0,
        pattern_window_cap: int = DEFAULT_WINDOW_CAP,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.paths = StorePaths(state_dir)
        self.policy = policy
        self._clock = clock or _utcnow
        self._lock = FileLock(self.paths.store_lock, timeout=lock_timeout, mode=0o600)
        self._db = RegistryDB(self.paths.registry, timeout=lock_timeout)
        self._held: RegistrySnapshot | None = None  # the registry as this store last read or wrote it
        self._write_behind: weakref.WeakSet[_Flushable] = weakref.WeakSet()
        self.patterns = PatternMemory(
            self.paths, window_cap=pattern_window_cap, lock_timeout=lock_timeout, clock=self._clock
        )

    @property
    def tools_dir(self) -> Path:
        return self.paths.tools

    def now(self) -> datetime:
        return self._clock()

    def _locked(self) -> AbstractContextManager[None]:
        return record_files.locked(self._lock)

    # --- writes held back by others ---------------------------------------------------------------------

    def add_write_behind(self, writer: _Flushable) -> None:
        """``writer`` holds writes to this store for a while (``ToolStoreSource``'s queued successes): a reader
        that must see every call that already returned calls :meth:`settle` first. Kept by weak reference."""
        self._write_behind.add(writer)

    def settle(self) -> None:
        """Write what the registered write-behind writers still hold (cheap when they hold nothing)."""
        for writer in list(self._write_behind):
            writer.flush()

    # --- registry ---------------------------------------------------------------------------------------

    def _role_dirs(self) -> list[Path]:
        try:
            return sorted(p for p in self.paths.tools.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return []

    def _load_registry(self) -> RegistryFile:
        """The registry now: the rows written since the copy this store holds (none changed: that copy), or
        every row; migrated from ``registry.json`` once, rebuilt when the file (or a row) is damaged."""
        try:
            snap = self._db.read(self._held)
        except CorruptRegistry as exc:
            return self._recover_registry(str(exc))
        if snap is None:
            return self._registry_missing()
        if snap.bad:
            return self._repair_rows(snap.bad)
        self._held = snap
        return snap.registry

    def _registry_missing(self) -> RegistryFile:
        """No registry.sqlite: migrate ``registry.json`` if there is one, rebuild from the role directories if
        there are any (under the lock), else an empty registry (nothing is created until the first write)."""
        legacy = self.paths.legacy_registry
        if not legacy.exists() and not legacy.is_symlink() and not self._role_dirs():
            return RegistryFile(schema_version=REGISTRY_SCHEMA_VERSION)
        with self._locked():
            if self._db.version() is not None:  # another process migrated or rebuilt it meanwhile
                return self._load_registry()
            found = record_files.load(  # SchemaTooNewError propagates: a newer sandforge's file is not migrated
                legacy, REGISTRY, lock=self._lock, now=self._clock, check=_check_registry
            )
            if found.value is None:
                return self._rebuild_registry()
            self._create_registry(found.value.tools)
            dest = record_files.unique_name(legacy.with_name("registry.json.migrated"))
            try:
                legacy.replace(dest)
            except OSError as exc:
                log.warning("registry.json migrated but not renamed (%s): it is ignored from now on", exc)
            log.info("registry.json migrated into %s (%d tools); kept as %s", self.paths.registry.name,
                     len(found.value.tools), dest.name)  # fmt: skip
            return self._load_registry()

    def _create_registry(self, tools: dict[str, RegistryEntry]) -> None:
        self._db.create(tools)
        self._held = None

    def _recover_registry(self, reason: str) -> RegistryFile:
        """registry.sqlite is damaged: under the lock, look again (another process may have rebuilt it), then
        move it aside (``registry.sqlite.corrupt-<timestamp>``, side files with it) and rebuild."""
        with self._locked():
            try:
                snap = self._db.read(None)  # the whole file again: the damage may be past its version
                if snap is not None and snap.bad:
                    return self._repair_rows(snap.bad)
                if snap is not None:
                    self._held = snap
                    return snap.registry
            except CorruptRegistry as exc:
                reason = str(exc)
            dest = record_files.quarantine_name(self.paths.registry, self._clock())
            try:
                self._db.move_aside(dest)
            except OSError as exc:
                raise StoreIOError(f"{self.paths.registry} is corrupt ({reason}) and cannot be moved aside: {exc}") \
                    from None  # fmt: skip
            log.warning("quarantined corrupt registry %s -> %s (%s)", self.paths.registry, dest.name, reason)
            return self._rebuild_registry()

    def _repair_rows(self, bad: Mapping[str, str]) -> RegistryFile:
        """Rows that do not decode or name another role: each rebuilt from its role directory (dropped when that
        holds no tool), the damaged text kept in the file's ``damaged`` table."""
        with self._locked():
            snap = self._db.read(None)
            if snap is None or not snap.bad:
                return self._load_registry()
            now = self._clock()
            rebuilt = {role: self._entry_from_dir(self.paths.role_dir(role), now) for role in snap.bad}
            self._db.delete(snap.bad, damaged=dict(snap.bad), now=now.isoformat())
            for role, entry in rebuilt.items():
                if entry is not None and entry.role == role:
                    self._db.put(role, _keep(entry))
            log.warning("registry: %d damaged row(s) rebuilt from their role directories: %s",
                        len(snap.bad), ", ".join(sorted(snap.bad)[:5]))  # fmt: skip
            self._held = None
            return self._load_registry()

    def registry(self) -> Mapping[str, RegistryEntry]:
        """All tools by role (read-only view)."""
        return MappingProxyType(self._load_registry().tools)

    def list_tools(self) -> list[RegistryEntry]:
        return sorted(self._load_registry().tools.values(), key=lambda e: e.role)

    def registry_version(self) -> str | None:
        """The registry's version now, ``<generation>:<seq>`` (one small read, nothing decoded), None when there
        is no registry or it is damaged: what a reader that keeps something derived from it compares."""
        try:
            version = self._db.version()
        except CorruptRegistry:
            return None
        return version.key() if version is not None else None

    def tool_count(self) -> int | None:
        """How many tools the registry holds (one small read, nothing decoded: what a page that cannot wait for
        :meth:`list_tools` shows), None when there is no registry or it is damaged."""
        try:
            return self._db.count()
        except CorruptRegistry:
            return None

    def list_tools_versioned(self) -> tuple[list[RegistryEntry], str | None]:
        """:meth:`list_tools` and the :meth:`registry_version` they are (None: rebuilt or missing)."""
        reg = self._load_registry()
        held = self._held
        version = held.version.key() if held is not None and held.registry is reg else None
        return sorted(reg.tools.values(), key=lambda e: e.role), version

    def changed_since(self, version: str) -> tuple[str, list[RegistryEntry]] | None:
        """The version now and the entries written since ``version`` (a :meth:`registry_version`), reading only
        those rows; None when that is not possible (deletes or a rebuild since, a damaged row or file: read
        everything with :meth:`list_tools_versioned`)."""
        generation, _, seq = version.rpartition(":")
        if not generation or not seq.isdigit():
            return None
        try:
            found = self._db.changed_since(RegistryVersion(generation, int(seq)))
        except CorruptRegistry:
            return None
        if found is None or found[2]:
            return None
        return found[0].key(), found[1]

    def get_tool(self, role: str) -> RegistryEntry | None:
        check_name(role, "role")
        if self._held is None:  # one row, not the whole registry (a fresh process's artifact page)
            try:
                entry = self._db.get(role)
            except CorruptRegistry:
                entry = None
            if entry is not None:
                return entry
        return self._load_registry().tools.get(role)

    def register_tool(self, contract: ToolContract) -> RegistryEntry:
        """Create or update a tool's contract (``delegate(...)``); usage and health are kept."""
        contract = contract.bounded()  # what the store keeps: over-long text cut (model_copy does not validate)
        role = check_name(contract.role, "role")
        now = self._clock()
        with self._locked():
            reg = self._load_registry()  # before any write: a new role dir must not look like a lost registry
            manifest, _ = self._manifest_locked(role, now, reg)
            self._write_manifest(manifest.model_copy(update={"contract": contract, "updated_at": now}))
            return self._update_entry(
                reg,
                role,
                now,
                lambda e: e.model_copy(
                    update={
                        "purpose": contract.purpose,
                        "deliverable": contract.deliverable,
                        "acceptance": contract.acceptance,
                        "failure_policy": contract.failure_policy,
                        "inputs": contract.inputs,
                        "files": contract.files,
                        "contract_fingerprint": contract.fingerprint(),
                        "updated_at": now,
                    }
                ),
            )

    def _update_entry(
        self, reg: RegistryFile, role: str, now: datetime, change: Callable[[RegistryEntry], RegistryEntry]
    ) -> RegistryEntry:
        """Modify-write of one registry row (the row as stored, read in the write's transaction); ``reg`` was
        loaded under the lock the caller still holds, so the registry file exists unless it was empty."""
        if not reg.tools and self._db.version() is None:
            self._create_registry({})
        fresh = RegistryEntry(role=role, created_at=now, updated_at=now, dir_name=safe_component(role))
        try:
            new_entry, version = self._db.put(role, lambda e: change(e or fresh))
        except CorruptRegistry:
            self._load_registry()  # damaged meanwhile (by hand): rebuilt, then written
            new_entry, version = self._db.put(role, lambda e: change(e or fresh))
        held = self._held
        if held is not None and held.version == RegistryVersion(version.generation, version.seq - 1):
            tools = dict(held.registry.tools)
            tools[role] = new_entry
            self._held = RegistrySnapshot(version, registry_of(tools), held.bad)
        return new_entry

    def _rebuild_registry(self) -> RegistryFile:
        """Registry lost or corrupt: rebuild it from the role directories (counters approximated). Caller holds
        the lock, and the path is free (missing, or moved aside)."""
        tools: dict[str, RegistryEntry] = {}
        now = self._clock()
        for role_dir in self._role_dirs():
            entry = self._entry_from_dir(role_dir, now)
            if entry is not None:
                tools[entry.role] = entry
        reg = RegistryFile(schema_version=REGISTRY_SCHEMA_VERSION, tools=tools)
        if tools or self.paths.tools.exists():
            try:
                self._create_registry(tools)
            except StoreIOError as exc:
                log.warning("rebuilt registry could not be written: %s", exc)
                return reg
        log.warning("registry rebuilt from %d role directories", len(tools))
        return self._load_registry() if tools or self.paths.tools.exists() else reg

    def _scan_role_dir(self, role_dir: Path) -> tuple[str | None, RoleManifest | None, list[MethodFile]]:
        manifest = record_files.load(role_dir / "manifest.json", MANIFEST, lock=self._lock, now=self._clock).value
        files: list[MethodFile] = []
        for path in sorted(role_dir.glob("*.json")):
            if path.name == "manifest.json":
                continue
            mf = record_files.load(path, METHOD, lock=self._lock, now=self._clock).value
            if mf is not None and path.name == StorePaths.method_file_name(mf.method_name):
                files.append(mf)
        role = manifest.role if manifest is not None else (files[0].role if files else None)
        if role is None or safe_component(role) != role_dir.name:
            return None, None, []
        return role, manifest, [f for f in files if f.role == role]

    def _entry_from_dir(self, role_dir: Path, now: datetime) -> RegistryEntry | None:
        role, manifest, files = self._scan_role_dir(role_dir)
        if role is None:
            return None
        arts = [a for f in files for a in f.generations()]
        contract = manifest.contract if manifest is not None else None
        used = [a.last_used_at for a in arts if a.last_used_at is not None]
        created = [a.created_at for a in arts] + ([manifest.created_at] if manifest else [])
        return RegistryEntry(
            role=role,
            purpose=contract.purpose if contract else None,
            deliverable=contract.deliverable if contract else None,
            acceptance=contract.acceptance if contract else None,
            failure_policy=contract.failure_policy if contract else None,
            inputs=contract.inputs if contract else None,
            files=contract.files if contract else None,
            contract_fingerprint=contract.fingerprint() if contract else None,
            created_at=min(created) if created else now,
            updated_at=now,
            last_used_at=max(used) if used else None,
            usage_count=sum(a.success_count + a.failure_count for a in arts),
            success_count=sum(a.success_count for a in arts),
            failure_count=sum(a.failure_count for a in arts),
            intrinsic_failure_count=sum(a.intrinsic_failure_count for a in arts),
            methods=sorted(f.method_name for f in files),
            capabilities=self._reusable_caps({f.method_name: f.current for f in files}),
            dir_name=role_dir.name,
        )

    # --- manifests --------------------------------------------------------------------------------------

    def manifest(self, role: str) -> RoleManifest | None:
        check_name(role, "role")
        return record_files.load(
            self.paths.manifest(role), MANIFEST, lock=self._lock, now=self._clock, check=_check_manifest(role)
        ).value

    def _write_manifest(self, manifest: RoleManifest) -> None:
        record_files.write(self.paths.manifest(manifest.role), manifest)

    def _manifest_locked(self, role: str, now: datetime, reg: RegistryFile) -> tuple[RoleManifest, bool]:
        """The role's manifest and whether it is on disk; rebuilt from the method files if missing or corrupt.

        Caller holds the lock."""
        current = self.manifest(role)
        if current is not None:
            return current, True
        methods: dict[str, str] = {}
        currents: dict[str, MethodArtifact] = {}
        role_dir = self.paths.role_dir(role)
        if role_dir.is_dir():
            scanned_role, _, files = self._scan_role_dir(role_dir)
            if scanned_role == role:
                for f in files:
                    methods[f.method_name] = StorePaths.method_file_name(f.method_name)
                    currents[f.method_name] = f.current
        entry = reg.tools.get(role)
        rebuilt = RoleManifest(
            schema_version=MANIFEST_SCHEMA_VERSION,
            role=role,
            contract=entry.contract() if entry is not None and entry.has_contract else None,
            created_at=entry.created_at if entry is not None else now,
            updated_at=now,
            methods=methods,
            capabilities={m: self._reusable_caps({m: a}) for m, a in currents.items()},
        )
        return rebuilt, False

    def _reusable_caps(self, currents: Mapping[str, MethodArtifact]) -> list[str]:
        caps: set[str] = set()
        for method, art in currents.items():
            if reuse_allowed(art, method, self.policy.dynamic_methods)[0]:
                caps.update(art.capabilities)
        return sorted(caps)

    def _note_method(self, role: str, current: MethodArtifact, now: datetime, reg: RegistryFile) -> list[str]:
        """Record the method and its reusable capabilities in the manifest; the role's capability union."""
        manifest, on_disk = self._manifest_locked(role, now, reg)
        methods = dict(manifest.methods)
        methods[current.method_name] = StorePaths.method_file_name(current.method_name)
        caps = dict(manifest.capabilities)
        caps[current.method_name] = self._reusable_caps({current.method_name: current})
        if not on_disk or methods != manifest.methods or caps != manifest.capabilities:
            self._write_manifest(
                manifest.model_copy(update={"methods": methods, "capabilities": caps, "updated_at": now})
            )
        return sorted({c for v in caps.values() for c in v})

    # --- artifacts --------------------------------------------------------------------------------------

    def lookup(self, role: str, method_name: str) -> ArtifactLookup:
        check_name(role, "role")
        check_name(method_name, "method name")
        loaded = record_files.load(
            self.paths.method_file(role, method_name),
            METHOD,
            lock=self._lock,
            now=self._clock,
            check=_check_method_file(role, method_name),
        )
        status = LookupStatus({"ok": "found", "missing": "missing", "corrupt": "corrupt"}[loaded.status])
        return ArtifactLookup(
            role, method_name, status, loaded.value, reason=loaded.reason, quarantined_to=loaded.quarantined_to
        )

    def select(
        self,
        role: str,
        method_name: str,
        *,
        contract_fingerprint: str | None,
        runtime_version: str,
        prompt_version: str | None = None,
    ) -> Selection:
        """Lookup plus :func:`~runtime.store.selection.select_artifact` under this store's policy."""
        return select_artifact(
            self.lookup(role, method_name).stored,
            method_name=method_name,
            contract_fingerprint=contract_fingerprint,
            runtime_version=runtime_version,
            prompt_version=prompt_version,
            policy=self.policy,
        )

    def history(self, role: str, method_name: str) -> list[MethodArtifact]:
        """Retained generations, current first. Empty if nothing is stored."""
        file = self.lookup(role, method_name).file
        return file.generations() if file is not None else []

    def save_artifact(self, candidate: ArtifactCandidate, *, source: ProgramSource) -> MethodArtifact:
        """Store ``candidate`` (which just ran successfully) as the new current generation.

        The previous current moves to history; history keeps RETAINED_PREVIOUS generations.
        Non-cacheable artifacts are stored too (they are simply never selected for reuse).
        """
        role = check_name(candidate.role, "role")
        method = check_name(candidate.method_name, "method name")
        now = self._clock()
        with self._locked():
            reg = self._load_registry()
            previous = self.lookup(role, method).file
            if previous is None:
                art = promote(candidate, source=source, generation=1, previous=None, now=now)
                new = MethodFile(
                    schema_version=ARTIFACT_SCHEMA_VERSION,
                    role=role,
                    method_name=method,
                    next_generation=2,
                    current=art,
                )
            else:
                art = promote(
                    candidate, source=source, generation=previous.next_generation, previous=previous.current, now=now
                )
                new = MethodFile(
                    schema_version=ARTIFACT_SCHEMA_VERSION,
                    role=role,
                    method_name=method,
                    next_generation=previous.next_generation + 1,
                    current=art,
                    history=[previous.current, *previous.history][:RETAINED_PREVIOUS],
                )
            record_files.write(self.paths.method_file(role, method), new)
            caps = self._note_method(role, art, now, reg)
            self._update_entry(
                reg,
                role,
                now,
                lambda e: e.model_copy(
                    update={
                        "usage_count": e.usage_count + 1,
                        "success_count": e.success_count + 1,
                        "last_used_at": now,
                        "methods": sorted({*e.methods, method}),
                        "capabilities": caps,
                    }
                ),
            )
        log.info("stored %s.%s generation %d (%s)", role, method, art.generation, source.value)
        return art

    def record_regeneration(self, candidate: ArtifactCandidate) -> MethodArtifact:
        """Fresh code (first generation or full regeneration) ran successfully: store it, reset the repair budget."""
        return self.save_artifact(candidate, source=ProgramSource.GENERATED)

    def record_repair(self, candidate: ArtifactCandidate) -> MethodArtifact:
        """Repaired code ran successfully: store it, ``repair_count_since_regen + 1``."""
        return self.save_artifact(candidate, source=ProgramSource.REPAIRED)

    def _update_generation(
        self,
        role: str,
        method_name: str,
        generation: int | None,
        change: Callable[[MethodArtifact], MethodArtifact],
        registry_change: Callable[[RegistryEntry], RegistryEntry],
    ) -> MethodArtifact | None:
        check_name(role, "role")
        check_name(method_name, "method name")
        now = self._clock()
        with self._locked():
            reg = self._load_registry()
            file = self.lookup(role, method_name).file
            if file is None:
                log.warning("no stored artifact for %r.%r; outcome not recorded", role, method_name)
                return None
            wanted = file.current.generation if generation is None else generation
            if wanted == file.current.generation:
                updated = change(file.current)
                new = file.model_copy(update={"current": updated})
            else:
                index = next((i for i, a in enumerate(file.history) if a.generation == wanted), None)
                if index is None:
                    log.warning(
                        "%r.%r generation %d is no longer retained; outcome not recorded", role, method_name, wanted
                    )
                    return None
                updated = change(file.history[index])
                history = list(file.history)
                history[index] = updated
                new = file.model_copy(update={"history": history})
            record_files.write(self.paths.method_file(role, method_name), new)
            self._update_entry(reg, role, now, registry_change)
            return updated

    def record_success(
        self, role: str, method_name: str, *, generation: int | None = None, count: int = 1
    ) -> MethodArtifact | None:
        """A persisted artifact ran successfully (``count`` times). ``generation``: the one that ran
        (default: current).

        Returns the updated artifact, or None when it is no longer stored (nothing recorded, logged).
        """
        now = self._clock()
        return self._update_generation(
            role,
            method_name,
            generation,
            lambda a: apply_success(a, now, count),
            lambda e: e.model_copy(
                update={
                    "usage_count": e.usage_count + count,
                    "success_count": e.success_count + count,
                    "last_used_at": now,
                }
            ),
        )

    def record_failure(
        self,
        role: str,
        method_name: str,
        failure_class: FailureClass | str,
        reason: str,
        *,
        generation: int | None = None,
    ) -> MethodArtifact | None:
        """A persisted artifact failed. Only INTRINSIC failures move its health toward repair/regeneration.

        ``failure_class``: a FailureClass, or any string (enum) with one of its values; else ValueError.
        """
        now = self._clock()
        failure_class = FailureClass(str(failure_class))
        intrinsic = failure_class is FailureClass.INTRINSIC
        return self._update_generation(
            role,
            method_name,
            generation,
            lambda a: apply_failure(a, failure_class, reason, now),
            lambda e: e.model_copy(
                update={
                    "usage_count": e.usage_count + 1,
                    "failure_count": e.failure_count + 1,
                    "intrinsic_failure_count": e.intrinsic_failure_count + int(intrinsic),
                    "last_used_at": now,
                }
            ),
        )

    def rollback(self, role: str, method_name: str, *, to: int | None = None) -> MethodArtifact:
        """Make a retained earlier generation current again (default: the one displaced last).

        The generations swap places, so a rollback can itself be rolled back. The restored generation
        gets a clean recent-health window (an operator vouched for it); its lifetime counters stay.
        """
        check_name(role, "role")
        check_name(method_name, "method name")
        now = self._clock()
        with self._locked():
            reg = self._load_registry()
            file = self.lookup(role, method_name).file
            if file is None:
                raise ToolNotFoundError(f"no stored artifact for {role!r} method {method_name!r}")
            retained = ", ".join(str(a.generation) for a in file.history) or "none"
            if to is not None and to == file.current.generation:
                raise RollbackError(f"generation {to} is already current")
            if not file.history:
                raise RollbackError(f"{role!r}.{method_name!r} has no earlier generation to roll back to")
            target = file.history[0] if to is None else next((a for a in file.history if a.generation == to), None)
            if target is None:
                raise RollbackError(
                    f"generation {to} of {role!r}.{method_name!r} is not retained",
                    hint=f"current is {file.current.generation}; retained earlier generations: {retained}",
                )
            if not target.checksum_ok():
                raise RollbackError(f"generation {target.generation} fails its code checksum; refusing to restore it")
            restored = target.model_copy(
                update={"recent_outcomes": [], "recent_failure_rate": 0.0, "consecutive_intrinsic_failures": 0}
            )
            history = [file.current, *(a for a in file.history if a.generation != target.generation)]
            record_files.write(
                self.paths.method_file(role, method_name),
                file.model_copy(update={"current": restored, "history": history}),
            )
            caps = self._note_method(role, restored, now, reg)
            self._update_entry(reg, role, now, lambda e: e.model_copy(update={"capabilities": caps}))
        log.info(
            "rolled back %s.%s from generation %d to %d",
            role,
            method_name,
            file.current.generation,
            restored.generation,
        )
        return restored

    def health_report(self, roles: Iterable[str] | None = None) -> list[ArtifactHealth]:
        """Health of every stored method (of ``roles`` if given), by role then method."""
        reg = self._load_registry().tools
        wanted = sorted(reg) if roles is None else sorted(set(roles))
        rows: list[ArtifactHealth] = []
        for role in wanted:
            entry = reg.get(role)
            if entry is None:
                raise ToolNotFoundError(f"no tool {role!r} in the store")
            for method in entry.methods:
                lk = self.lookup(role, method)
                art = lk.artifact
                if art is None:
                    rows.append(ArtifactHealth(role=role, method_name=method, status=lk.status))
                    continue
                reusable, why = reuse_allowed(art, method, self.policy.dynamic_methods)
                rows.append(
                    ArtifactHealth(
                        role=role,
                        method_name=method,
                        status=lk.status,
                        generation=art.generation,
                        health=assess_health(art, policy=self.policy),
                        checksum_ok=art.checksum_ok(),
                        reusable=reusable,
                        reuse_reason=why,
                        artifact=art,
                    )
                )
        return rows

    # --- pruning ----------------------------------------------------------------------------------------

    def _prune_candidates(self, reg: RegistryFile, cutoff: datetime) -> list[PruneCandidate]:
        stale = sorted((e for e in reg.tools.values() if _activity(e) < cutoff), key=lambda e: (_activity(e), e.role))
        return [
            PruneCandidate(
                role=e.role,
                dir_name=safe_component(e.role),
                last_activity=_activity(e),
                usage_count=e.usage_count,
                methods=list(e.methods),
            )
            for e in stale
        ]

    def prune(self, *, older_than_days: float, apply: bool = False) -> PrunePlan:
        """Tools unused for ``older_than_days``. Dry run unless ``apply``: then each tool's directory is
        moved to ``tools/.archive/<timestamp>/`` with its registry entry, and only then removed from the
        registry (archive before delete; restore by moving the directory back and re-registering)."""
        if older_than_days < 0:
            raise ValueError("older_than_days must be >= 0")
        now = self._clock()
        cutoff = now - timedelta(days=older_than_days)
        if not apply:
            return PrunePlan(
                cutoff=cutoff, applied=False, candidates=self._prune_candidates(self._load_registry(), cutoff)
            )
        with self._locked():
            reg = self._load_registry()
            candidates = self._prune_candidates(reg, cutoff)
            if not candidates:
                return PrunePlan(cutoff=cutoff, applied=True, candidates=[])
            archive = record_files.quarantine_name(self.paths.archive / now.strftime("%Y%m%dT%H%M%S%fZ"), now)
            try:
                make_dirs(archive.parent)
                archive.mkdir(mode=0o700)
                for c in candidates:
                    dest = archive / c.dir_name
                    src = self.paths.role_dir(c.role)
                    if src.is_dir() and not src.is_symlink():
                        src.replace(dest)
                    else:
                        dest.mkdir(mode=0o700)
                    record_files.write(dest / "registry-entry.json", reg.tools[c.role])
            except OSError as exc:
                raise StoreIOError(f"archiving into {archive} failed: {exc}") from exc
            self._db.delete([c.role for c in candidates])
        log.info("pruned %d tools into %s", len(candidates), archive)
        return PrunePlan(cutoff=cutoff, applied=True, archive_dir=str(archive), candidates=candidates)

    # --- prompts and pattern memory ---------------------------------------------------------------------

    def capability_index(self, *, exclude_role: str | None = None) -> dict[str, list[str]]:
        """Capability label -> roles of registered tools whose reusable methods provide it."""
        index: dict[str, list[str]] = {}
        for entry in self.list_tools():
            if entry.role == exclude_role:
                continue
            for cap in entry.capabilities:
                index.setdefault(cap, []).append(entry.role)
        return index

    def record_pattern(
        self,
        role: str,
        method_name: str,
        capability_patterns: Iterable[str],
        *,
        ok: bool = True,
        error_type: str | None = None,
    ) -> None:
        """Pattern memory: one generated or repaired call of ``role.method_name`` and its capability labels."""
        self.patterns.record(
            role, method_name, capability_patterns, outcome_status="ok" if ok else "error", error_type=error_type
        )

    def promotion_signal(
        self,
        role: str,
        method_name: str,
        *,
        window: int = DEFAULT_SUMMARY_WINDOW,
        threshold: int = DEFAULT_PROMOTION_THRESHOLD,
    ) -> PromotionSignal:
        summary = self.patterns.recent_patterns_for(role, method_name, window)
        return promotion_signal(summary, self.capability_index(exclude_role=role), threshold=threshold)

    def recent_patterns_block(
        self,
        role: str,
        method_name: str,
        *,
        depth: int,
        window: int = DEFAULT_SUMMARY_WINDOW,
        top_n: int = 5,
        threshold: int = DEFAULT_PROMOTION_THRESHOLD,
    ) -> str | None:
        """``<recent_patterns>`` for this call, or None (depth > 0, stable method, nothing observed)."""
        if depth != 0 or not is_dynamic_method(method_name, self.policy.dynamic_methods):
            return None
        return render_recent_patterns(
            self.patterns.recent_patterns_for(role, method_name, window),
            depth=depth,
            tool_index=self.capability_index(exclude_role=role),
            dynamic_methods=self.policy.dynamic_methods,
            top_n=top_n,
            threshold=threshold,
        )

    def known_tools(
        self, *, top_n: int = DEFAULT_TOP_N, exclude_roles: Iterable[str] = (), contracted_only: bool = False
    ) -> list[RegistryEntry]:
        return rank_known_tools(
            self._load_registry().tools.values(),
            now=self._clock(),
            top_n=top_n,
            exclude_roles=exclude_roles,
            contracted_only=contracted_only,
        )

    def known_tools_block(
        self, *, top_n: int = DEFAULT_TOP_N, exclude_roles: Iterable[str] = (), contracted_only: bool = False
    ) -> str | None:
        return render_known_tools(
            self.known_tools(top_n=top_n, exclude_roles=exclude_roles, contracted_only=contracted_only)
        )
