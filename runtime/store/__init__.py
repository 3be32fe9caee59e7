"""ToolStore (ADR 0012/0013): cross-session tools and artifacts, selection policy, cacheability, patterns.

This first layer holds the records and the pure policy functions (no files yet).
"""

from __future__ import annotations

from runtime.store.cacheability import (
    DEFAULT_DYNAMIC_METHODS,
    Cacheability,
    CacheabilityHint,
    CacheabilityReason,
    assess_cacheability,
    find_baked_inputs,
    is_dynamic_method,
)
from runtime.store.errors import (
    InvalidNameError,
    RollbackError,
    SchemaTooNewError,
    StoreError,
    StoreIOError,
    StoreLockTimeout,
    ToolNotFoundError,
)
from runtime.store.fingerprint import code_checksum, contract_fingerprint
from runtime.store.health import ArtifactCandidate, apply_failure, apply_success, classify_failure, promote
from runtime.store.models import FailureClass, MethodArtifact, ProgramSource, RegistryEntry, ToolContract
from runtime.store.selection import (
    CORRUPT,
    DEFAULT_POLICY,
    MAX_REPAIRS_BEFORE_REGEN,
    Decision,
    HealthStatus,
    Selection,
    SelectionPolicy,
    SelectionReason,
    assess_health,
    runtime_compatible,
    select_artifact,
)

__all__ = [
    "CORRUPT",
    "DEFAULT_DYNAMIC_METHODS",
    "DEFAULT_POLICY",
    "MAX_REPAIRS_BEFORE_REGEN",
    "ArtifactCandidate",
    "Cacheability",
    "CacheabilityHint",
    "CacheabilityReason",
    "Decision",
    "FailureClass",
    "HealthStatus",
    "InvalidNameError",
    "MethodArtifact",
    "ProgramSource",
    "RegistryEntry",
    "RollbackError",
    "SchemaTooNewError",
    "Selection",
    "SelectionPolicy",
    "SelectionReason",
    "StoreError",
    "StoreIOError",
    "StoreLockTimeout",
    "ToolContract",
    "ToolNotFoundError",
    "apply_failure",
    "apply_success",
    "assess_cacheability",
    "assess_health",
    "classify_failure",
    "code_checksum",
    "contract_fingerprint",
    "find_baked_inputs",
    "is_dynamic_method",
    "promote",
    "runtime_compatible",
    "select_artifact",
]
