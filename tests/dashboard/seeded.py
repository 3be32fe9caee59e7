"""A small store for the snapshot tests: three roles with one healthy method each, written an hour ago."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sandforge.runtime.store import ArtifactCandidate, ToolStore, assess_cacheability

ROLES = ("calc", "fmt", "geo")


def age(store: ToolStore) -> None:
    """Every store file written an hour ago: past the racy window, so stamps are trusted."""
    hour_ago = time.time() - 3600
    for path in store.paths.tools.rglob("*.json"):
        os.utime(path, (hour_ago, hour_ago))


def seeded_store(state: Path) -> ToolStore:
    """``ROLES``, each with ``run`` (generation 1, three successes), aged."""
    store = ToolStore(state)
    for k, role in enumerate(ROLES):
        code = f"return args[0] * {k + 3}\n"
        store.record_regeneration(ArtifactCandidate(
            role=role, method_name="run", code=code, runtime_version="0.1.0", prompt_version=None,
            cacheability=assess_cacheability("run", code, [2], {}, is_delegated_contract=False),
        ))  # fmt: skip
        store.record_success(role, "run", count=3)
    age(store)
    return store
