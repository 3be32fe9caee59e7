"""Removing environments: what ``sandforge envs prune`` plans and does.

Leftovers (killed builds, damaged directories) always go. A ready environment goes unless a persisted
artifact uses it (its manifest is one of ``in_use``), which keeps it unless ``force``. Removal renames the
directory out of the ready name first, under the environment's build lock, so no one sees half of it."""

from __future__ import annotations

import shutil
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.environments.builder import TMP_PREFIX, EnvironmentStore
from sandforge.runtime.environments.manifest import Manifest


class PruneEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    what: str  # "environment" | "leftover"
    size_bytes: int = 0
    kept: bool = False
    why: str = ""


def plan(store: EnvironmentStore, in_use: Collection[Manifest], *, force: bool = False) -> list[PruneEntry]:
    entries = [PruneEntry(name=path.name, what="leftover", why="not a ready environment") for path in store.leftovers()]
    for record in store.ready():
        used = record.spec.manifest in in_use
        entries.append(
            PruneEntry(
                name=record.env_id,
                what="environment",
                size_bytes=record.size_bytes,
                kept=used and not force,
                why="used by a persisted artifact" + (" (--force)" if force else "") if used else "unused",
            )
        )
    return entries


def apply(store: EnvironmentStore, entries: list[PruneEntry]) -> int:
    """Remove what the plan does not keep; the number removed."""
    removed = 0
    for entry in entries:
        if entry.kept:
            continue
        path = store.envs / entry.name
        if entry.what == "environment":
            with store.build_lock(entry.name):
                doomed = store.envs / f"{TMP_PREFIX}{entry.name}-removing"
                if not path.is_dir():
                    continue
                path.rename(doomed)
            path = doomed
        shutil.rmtree(path, ignore_errors=True)
        removed += 1 if not Path(path).exists() else 0
    return removed
