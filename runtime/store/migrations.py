"""Decoding of stored records: current versions validated directly, older ones migrated, newer refused.

Schema history (every step is a pure ``dict -> dict`` function below, tested in tests/store/):

registry.json
  v1  ``{"tools": {role: {role, purpose, deliverable, acceptance, failure_policy, created_at,
      last_used_at, usage_count}}}`` (a list of entries is accepted too); no ``schema_version`` key.
  v2  ``schema_version`` on the file and on every entry; entries gain ``contract_fingerprint``,
      ``updated_at``, ``success_count``, ``failure_count``, ``intrinsic_failure_count``, ``methods``,
      ``capabilities``, ``dir_name``.
<role>/manifest.json
  v1  ``{"role": ..., "methods": [method names]}``.
  v2  ``methods`` maps names to file names; ``contract``, ``created_at``, ``updated_at``.
<role>/<method>.json
  v1  one bare artifact with the ADR 0012 section 3 fields (no cacheability, no history).
  v2  ``{current, history, next_generation}``; artifacts gain ``generation``, ``program_source``,
      ``capabilities``, the ADR 0013 fields (``cacheable`` stays null: legacy rule applies),
      ``adaptive_failure_count``, ``recent_outcomes`` (rebuilt from ``recent_failure_rate``),
      ``consecutive_intrinsic_failures``, ``last_regenerated_at``.
patterns.json
  v1  current (the plan's data contract).

A file without ``schema_version`` is version 1. Migrated records are written back on the next write to
that file, not on read (reads take no lock).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.store.errors import SchemaTooNewError
from sandforge.runtime.store.fingerprint import code_checksum
from sandforge.runtime.store.models import (
    ARTIFACT_SCHEMA_VERSION,
    HEALTH_WINDOW,
    MANIFEST_SCHEMA_VERSION,
    PATTERNS_SCHEMA_VERSION,
    REGISTRY_SCHEMA_VERSION,
    MethodFile,
    PatternsFile,
    RegistryFile,
    RoleManifest,
)
from sandforge.runtime.store.paths import StorePaths, safe_component

M = TypeVar("M", bound=BaseModel)
Raw = dict[str, Any]
Step = Callable[[Raw], Raw]


class CorruptRecord(Exception):
    """The bytes are not a valid record of this kind (bad JSON, wrong shape, failed validation)."""


@dataclass(frozen=True)
class RecordKind(Generic[M]):
    name: str
    model: type[M]
    current: int
    #: ``steps[v]`` turns a version-v dict into a version-(v+1) dict.
    steps: dict[int, Step] = field(default_factory=dict)


def _epoch() -> str:
    return datetime(1970, 1, 1, tzinfo=UTC).isoformat()


def _aware(value: Any) -> Any:
    """ISO timestamp strings without an offset are taken as UTC (older writers used naive times)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.isoformat()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


# --- registry ------------------------------------------------------------------------------------------


def _registry_v1_to_v2(data: Raw) -> Raw:
    tools = data.get("tools", {})
    if isinstance(tools, list):
        tools = {t.get("role"): t for t in tools if isinstance(t, dict)}
    if not isinstance(tools, dict):
        raise CorruptRecord("registry v1: 'tools' is neither an object nor a list")
    out: dict[str, Raw] = {}
    for role, entry in tools.items():
        if not isinstance(entry, dict) or not isinstance(role, str):
            raise CorruptRecord("registry v1: malformed entry")
        created = _aware(entry.get("created_at")) or _epoch()
        out[role] = {
            **entry,
            "schema_version": 2,
            "role": entry.get("role", role),
            "created_at": created,
            "updated_at": created,
            "last_used_at": _aware(entry.get("last_used_at")),
            "usage_count": _int(entry.get("usage_count")),
            "dir_name": safe_component(role),
        }
    return {"schema_version": 2, "tools": out}


# --- manifest ------------------------------------------------------------------------------------------


def _manifest_v1_to_v2(data: Raw) -> Raw:
    methods = data.get("methods", [])
    if isinstance(methods, dict):
        names = list(methods)
    elif isinstance(methods, list):
        names = [m for m in methods if isinstance(m, str)]
    else:
        raise CorruptRecord("manifest v1: 'methods' is neither a list nor an object")
    created = _aware(data.get("created_at")) or _epoch()
    return {
        "schema_version": 2,
        "role": data.get("role"),
        "contract": None,
        "created_at": created,
        "updated_at": _aware(data.get("updated_at")) or created,
        "methods": {name: StorePaths.method_file_name(name) for name in names},
    }


# --- method artifacts ----------------------------------------------------------------------------------


def _artifact_v1_to_v2(art: Raw, generation: int) -> Raw:
    successes = _int(art.get("success_count"))
    intrinsic = _int(art.get("intrinsic_failure_count"))
    rate = art.get("recent_failure_rate", 0.0)
    rate = float(rate) if isinstance(rate, int | float) and 0.0 <= rate <= 1.0 else 0.0
    window = min(successes + intrinsic, HEALTH_WINDOW)
    failed = min(round(rate * window), window)
    code = art.get("code", "")
    return {
        **art,
        "schema_version": 2,
        "generation": generation,
        "code_checksum": art.get("code_checksum", code_checksum(code) if isinstance(code, str) else ""),
        "runtime_version": str(art.get("runtime_version") or "0"),
        "program_source": "generated",
        "capabilities": [],
        "cacheable": None,
        "cacheability_reason": None,
        "input_sensitive": False,
        "adaptive_failure_count": 0,
        "recent_failure_rate": (failed / window) if window else 0.0,
        "recent_outcomes": [True] * (window - failed) + [False] * failed,
        "consecutive_intrinsic_failures": 0,
        "created_at": _aware(art.get("created_at")) or _epoch(),
        "last_used_at": _aware(art.get("last_used_at")),
        "last_repaired_at": _aware(art.get("last_repaired_at")),
        "last_regenerated_at": None,
    }


def _method_v1_to_v2(data: Raw) -> Raw:
    return {
        "schema_version": 2,
        "role": data.get("role"),
        "method_name": data.get("method_name"),
        "next_generation": 2,
        "current": _artifact_v1_to_v2(data, 1),
        "history": [],
    }


REGISTRY = RecordKind("registry", RegistryFile, REGISTRY_SCHEMA_VERSION, {1: _registry_v1_to_v2})
MANIFEST = RecordKind("manifest", RoleManifest, MANIFEST_SCHEMA_VERSION, {1: _manifest_v1_to_v2})
METHOD = RecordKind("method artifact", MethodFile, ARTIFACT_SCHEMA_VERSION, {1: _method_v1_to_v2})
PATTERNS = RecordKind("pattern memory", PatternsFile, PATTERNS_SCHEMA_VERSION, {})


def decode(kind: RecordKind[M], raw: bytes, path: Path) -> tuple[M, bool]:
    """Parse ``raw`` as a ``kind`` record: ``(model, migrated)``.

    Raises CorruptRecord for anything unusable and SchemaTooNewError for a version from the future.
    """
    with gc_paused():  # thousands of small records form no cycles: collections would find nothing
        return _decode(kind, raw, path)


def _decode(kind: RecordKind[M], raw: bytes, path: Path) -> tuple[M, bool]:
    try:  # fast path: a current record validates straight from bytes (pydantic-core, no dict detour)
        return kind.model.model_validate_json(raw), False
    except ValidationError:
        pass
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorruptRecord(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptRecord("not a JSON object")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptRecord(f"bad schema_version {version!r}")
    if version > kind.current:
        raise SchemaTooNewError(path, kind.name, version, kind.current)
    migrated = version < kind.current
    while version < kind.current:
        step = kind.steps.get(version)
        if step is None:
            raise CorruptRecord(f"no migration from {kind.name} schema_version {version}")
        data = step(data)
        version += 1
    try:
        return kind.model.model_validate(data), migrated
    except ValidationError as exc:
        first = exc.errors()[0]["msg"]
        raise CorruptRecord(f"invalid {kind.name}: {exc.error_count()} error(s), first: {first}") from None
