"""Every method's health at a glance, kept warm for the pages: a cache keyed by each method file's stat.

The Tools and Overview pages filter, sort and count by health over *every* tool (10,000 of them in the
benchmark), which would mean decoding every method file per page. This cache decodes a file only when it
changed, so a warm page costs one ``stat`` per method and the registry read (itself cached by content in
the store). A stat alone cannot tell every change: an atomic rename frees an inode the next write may get
again, and mtimes tick coarsely (a jiffy, a second on some filesystems), so two writes close together can
leave (inode, mtime, size) as they were. :func:`file_stamp` therefore trusts only a file whose mtime is
already RACY_S in the past when it is looked at (git's "racily clean" rule): any later write gets a later
mtime. A file written more recently is simply read again.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.dashboard.healthsnap import HealthSnapshot, entry_digest, row_key
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.models import MethodArtifact, RegistryEntry
from sandforge.runtime.store.paths import StorePaths, safe_component
from sandforge.runtime.store.selection import HealthStatus, assess_health, prompt_version_matches, reuse_allowed

#: a file modified less than this before it is looked at may change again without its stat changing
RACY_S = 2.0
#: (inode, mtime ns, size) of a file whose stat will change on its next write; (0, 0, 0): no such file
Stamp = tuple[int, int, int]


def file_stamp(path: str) -> Stamp | None:
    """The stamp of ``path``, or None when it must not be trusted: modified within RACY_S (or in the future)."""
    try:
        st = os.lstat(path)
    except OSError:
        return (0, 0, 0)
    if time.time_ns() - st.st_mtime_ns < RACY_S * 1e9:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


Badge = Literal["healthy", "degraded", "stale", "unproven", "non-cacheable", "missing"]
#: a tool's badge is the worst of its methods', in this order
BADGE_ORDER: tuple[Badge, ...] = ("degraded", "stale", "missing", "unproven", "non-cacheable", "healthy")


class MethodHealth(BaseModel):
    """One method's current artifact as the dashboard shows it (never its code)."""

    model_config = ConfigDict(frozen=True)

    method: str
    badge: Badge
    health: str | None = None
    generation: int | None = None
    cacheable: bool | None = None
    cacheability_reason: str | None = None
    reusable: bool | None = None
    reuse_reason: str = ""
    success_count: int = 0
    failure_count: int = 0
    intrinsic_failure_count: int = 0
    extrinsic_failure_count: int = 0
    adaptive_failure_count: int = 0
    recent_failure_rate: float = 0.0
    repairs_since_regeneration: int = 0
    prompt_version_match: bool | None = None
    checksum_ok: bool | None = None
    last_used_at: datetime | None = None


def badge_of(art: MethodArtifact, entry: RegistryEntry, store: ToolStore) -> tuple[Badge, str]:
    """(badge, health): stale when the contract changed or the prompt moved on, degraded when unhealthy or its
    code fails its checksum, non-cacheable when it may never be reused, else the store's health word."""
    health = assess_health(art, prompt_version=PROMPT_VERSION, policy=store.policy)
    if not art.checksum_ok() or health in (HealthStatus.DEGRADED, HealthStatus.UNHEALTHY):
        return "degraded", health.value
    contract_moved = entry.contract_fingerprint is not None and art.contract_fingerprint != entry.contract_fingerprint
    if contract_moved or prompt_version_matches(art, PROMPT_VERSION) is False:
        return "stale", health.value
    if health is HealthStatus.UNPROVEN:
        return "unproven", health.value
    reusable, _ = reuse_allowed(art, art.method_name, store.policy.dynamic_methods)
    return ("healthy" if reusable else "non-cacheable"), health.value


def method_health(art: MethodArtifact, entry: RegistryEntry, store: ToolStore) -> MethodHealth:
    badge, health = badge_of(art, entry, store)
    reusable, why = reuse_allowed(art, art.method_name, store.policy.dynamic_methods)
    return MethodHealth(
        method=art.method_name, badge=badge, health=health, generation=art.generation, cacheable=art.cacheable,
        cacheability_reason=art.cacheability_reason, reusable=reusable, reuse_reason=why,
        success_count=art.success_count, failure_count=art.failure_count,
        intrinsic_failure_count=art.intrinsic_failure_count, extrinsic_failure_count=art.extrinsic_failure_count,
        adaptive_failure_count=art.adaptive_failure_count, recent_failure_rate=art.recent_failure_rate,
        repairs_since_regeneration=art.repair_count_since_regen,
        prompt_version_match=prompt_version_matches(art, PROMPT_VERSION), checksum_ok=art.checksum_ok(),
        last_used_at=art.last_used_at,
    )  # fmt: skip


class HealthCache:
    """Method health per tool, re-read only when something changed.

    Every store write that changes a method file also changes the tool's registry entry (usage, last use,
    capabilities) under the store's lock, so an entry equal to the one last seen means its methods are as they
    were: no file is touched. ``verify`` (the rows a page shows, the artifact page) also compares each method
    file's stamp (:func:`file_stamp`), so a file changed behind the store's back (by hand) shows as soon as it
    is looked at; a file written within RACY_S is read again every time. With a ``snapshot``
    (:mod:`.healthsnap`), a method this process has not read yet is taken from the persisted row when its
    key (the entry's digest and the file's stamp) still holds, and what is computed is written back by
    :meth:`persist`: a fresh process reads only the method files that changed.
    """

    def __init__(self, store: ToolStore, snapshot: HealthSnapshot | None = None) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._tools: dict[str, tuple[RegistryEntry, list[MethodHealth]]] = {}
        self._files: dict[tuple[str, str], tuple[tuple[Stamp, str | None], MethodHealth]] = {}
        self._paths: dict[tuple[str, str], str] = {}
        self._names: dict[str, str] = {}
        self._tools_dir = str(store.paths.tools)
        self._snapshot = snapshot
        self._persisted: dict[tuple[str, str], tuple[bytes, str]] | None = None
        self._digests: dict[str, tuple[RegistryEntry, bytes]] = {}
        self._dirty: list[tuple[str, str, bytes, str]] = []
        self._fetched: dict[tuple[str, str], tuple[bytes, str]] = {}

    def prefetch(self, pairs: list[tuple[str, str]]) -> None:
        """Read the persisted rows of these methods only, when every row has not been read yet: a page that
        shows a few tools (from the persisted board) does not read all of them."""
        if self._snapshot is not None and self._persisted is None:
            wanted = [p for p in pairs if p not in self._fetched]
            if wanted:
                self._fetched.update(self._snapshot.rows(wanted))

    def methods(self, entry: RegistryEntry, *, verify: bool = False) -> list[MethodHealth]:
        hit = self._tools.get(entry.role)
        if not verify and hit is not None and (hit[0] is entry or hit[0] == entry):
            return hit[1]
        value = [self.method(entry, m) for m in entry.methods]
        with self._lock:
            self._tools[entry.role] = (entry, value)
        return value

    def _path(self, role: str, method: str) -> str:
        """The method file's path, as ``StorePaths.method_file`` makes it (as text: 10,000 of them on a first
        page, where pathlib's objects cost more than the stat)."""
        path = self._paths.get((role, method))
        if path is None:
            name = self._names.get(method)
            if name is None:
                name = self._names[method] = StorePaths.method_file_name(method)
            path = self._paths[(role, method)] = f"{self._tools_dir}/{safe_component(role)}/{name}"
        return path

    def method(self, entry: RegistryEntry, method: str) -> MethodHealth:
        stamp = file_stamp(self._path(entry.role, method))  # before the read: a later write changes it
        with self._lock:
            hit = self._files.get((entry.role, method))
        if stamp is not None and hit is not None and hit[0] == (stamp, entry.contract_fingerprint):
            return hit[1]
        key = self._snapshot_key(entry, stamp)
        value = self._persisted_hit(entry.role, method, key)
        if value is None:
            art = self.store.lookup(entry.role, method).artifact
            value = (method_health(art, entry, self.store) if art is not None
                     else MethodHealth(method=method, badge="missing"))  # fmt: skip
            if key is not None:
                with self._lock:
                    self._dirty.append((entry.role, method, key, value.model_dump_json()))
        if stamp is not None:
            with self._lock:
                self._files[(entry.role, method)] = ((stamp, entry.contract_fingerprint), value)
        return value

    # --- the persisted snapshot (:mod:`.healthsnap`) -------------------------------------------------------

    def _snapshot_key(self, entry: RegistryEntry, stamp: Stamp | None) -> bytes | None:
        """The row key of this method now, or None (no snapshot, or a file written within RACY_S)."""
        if self._snapshot is None or stamp is None:
            return None
        return row_key(self.entry_key(entry)[0], stamp)

    def entry_key(self, entry: RegistryEntry) -> tuple[bytes, str | None]:
        """The digest of ``entry`` (:func:`~.healthsnap.entry_digest`), and its JSON when computed now (None
        when the digest was already known for this entry)."""
        known = self._digests.get(entry.role)
        if known is not None and (known[0] is entry or known[0] == entry):
            return known[1], None
        text = entry.model_dump_json()
        digest = entry_digest(text)
        self._digests[entry.role] = (entry, digest)
        return digest, text

    def _persisted_hit(self, role: str, method: str, key: bytes | None) -> MethodHealth | None:
        if key is None or self._snapshot is None:
            return None
        row = self._fetched.get((role, method))
        if row is None:
            if self._persisted is None:
                self._persisted = self._snapshot.load()
            row = self._persisted.get((role, method))
        if row is None or row[0] != key:
            return None
        try:
            return MethodHealth.model_validate_json(row[1])
        except ValueError:
            return None

    def persist(self, present: set[tuple[str, str]] | None = None) -> None:
        """Write the rows computed since the last call to the snapshot (one transaction); with ``present``
        (every method the registry lists now), drop the rows of the others."""
        with self._lock:
            rows, self._dirty = self._dirty, []
        if present is not None and self._persisted is None and self._snapshot is not None:
            self._persisted = self._snapshot.load()
        persisted = self._persisted
        gone = [k for k in persisted if k not in present] if present is not None and persisted is not None else []
        if self._snapshot is not None and (rows or gone):
            self._snapshot.save(rows, gone)
            self._fetched.update({(r, m): (k, v) for r, m, k, v in rows if (r, m) in self._fetched})
            if persisted is not None:
                persisted.update({(r, m): (k, v) for r, m, k, v in rows})
                for k in gone:
                    persisted.pop(k, None)


def worst(badges: list[Badge]) -> Badge:
    """The tool's badge: the worst of its methods' (``unproven`` for a tool with no method yet)."""
    for badge in BADGE_ORDER:
        if badge in badges:
            return badge
    return "unproven"
