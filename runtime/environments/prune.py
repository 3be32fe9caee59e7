"""Removing environments: what ``sandforge envs prune`` / ``envs remove`` plan and do.

Environments are kept by **id**: a persisted artifact stores the `EnvironmentSpec` it runs with (any
retained generation counts), and the environment of that spec's id is the one it uses; nothing else keeps
one (an environment built for another interpreter, source or pin set of the same manifest is not used by
it). Leftovers (killed builds, damaged directories) always go. A used environment is kept unless ``force``.
Removal renames the directory out of the ready name first, under the environment's build lock, so no one
sees half of it."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.environments.builder import TMP_PREFIX, EnvironmentStore
from sandforge.runtime.environments.identity import ID_PATTERN
from sandforge.runtime.errors import UsageError

#: The shortest id prefix ``show``/``remove``/``prune`` accept for an environment id.
MIN_PREFIX = 4


class PruneEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    what: str  # "environment" | "leftover"
    size_bytes: int = 0
    kept: bool = False
    why: str = ""
    used_by: tuple[str, ...] = ()


def resolve_id(store: EnvironmentStore, text: str) -> str:
    """The ready environment ``text`` names: its id, or a unique prefix of at least `MIN_PREFIX` hex digits."""
    wanted = text.strip().lower()
    if ID_PATTERN.fullmatch(wanted) and store.record(wanted) is not None:
        return wanted
    if len(wanted) < MIN_PREFIX or not all(c in "0123456789abcdef" for c in wanted):
        raise UsageError(f"no ready environment {text!r}", hint="`sandforge envs list` shows them")
    matches = [r.env_id for r in store.ready() if r.env_id.startswith(wanted)]
    if not matches:
        raise UsageError(f"no ready environment {text!r}", hint="`sandforge envs list` shows them")
    if len(matches) > 1:
        raise UsageError(f"{text!r} names {len(matches)} environments", hint="give more of the id")
    return matches[0]


def plan(
    store: EnvironmentStore,
    in_use: Mapping[str, Collection[str]],
    *,
    force: bool = False,
    only: Collection[str] | None = None,
) -> list[PruneEntry]:
    """What pruning would do. ``in_use``: env id -> who uses it (``role.method``); ``only``: these ids and no
    leftovers (``envs remove``, ``envs prune ID...``), else every ready environment and every leftover."""
    entries: list[PruneEntry] = []
    if only is None:
        entries += [PruneEntry(name=p.name, what="leftover", why="not a ready environment") for p in store.leftovers()]
    for record in store.ready():
        if only is not None and record.env_id not in only:
            continue
        users = tuple(sorted(in_use.get(record.env_id, ())))
        why = "unused"
        if users:
            why = "used by a persisted artifact (" + ", ".join(users) + ")" + (" (--force)" if force else "")
        kept = bool(users) and not force
        entry = PruneEntry(name=record.env_id, what="environment", size_bytes=record.size_bytes, kept=kept, why=why,
                           used_by=users)  # fmt: skip
        entries.append(entry)
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
