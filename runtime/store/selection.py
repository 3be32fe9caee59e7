"""Artifact selection policy (ADR 0012 sections 4 to 6, ADR 0013 sections 3 and 4), as pure functions.

``select_artifact`` looks at what the store holds for ``(role, method_name)`` and says what the lifecycle
does next. Checks, in order; the first that applies decides:

====================  ==========================================  =========================================
decision              when                                        the lifecycle then
====================  ==========================================  =========================================
GENERATE              nothing stored; file corrupt (quarantined);  generate fresh code from scratch; the
                      runtime-incompatible; code_checksum          stored code is not shown to the model
                      mismatch (tampered/damaged)                  and never executed
REGENERATE            method is dynamic dispatch (ask, chat, ...)  generate from scratch (a full
                      or artifact non-cacheable (ADR 0013; legacy  regeneration: ``record_regeneration``
                      artifacts of dynamic methods too); unproven  resets the repair budget)
                      or unhealthy; stale/degraded with the
                      repair budget spent
REPAIR                contract fingerprint changed (stale), or     targeted repair: prior code
                      degraded health, and                         (``selection.artifact``) plus failure
                      ``repair_count_since_regen <                 context; on success
                      max_repairs_before_regen``                   ``record_repair``, else regenerate
EXECUTE_PERSISTED     intact, compatible, cacheable, current       run ``selection.artifact.code`` through
                      contract, healthy                            the same validation and sandbox as
                                                                   fresh code; then record_success/failure
====================  ==========================================  =========================================

Health (:func:`assess_health`): UNPROVEN without any success; UNHEALTHY when at least ``min_samples``
outcomes are in the window and the intrinsic failure rate is ``>= unhealthy_failure_rate``; DEGRADED when
the last recorded outcome was an intrinsic failure, the rate is above the threshold, or at least
``adaptive_degraded_failures`` (3) of the last ADAPTIVE_WINDOW (5) answers were adaptive failures (a
stored program that keeps returning ``Outcome.error`` on real inputs); else HEALTHY.
``prompt_version`` only picks the threshold: equal (or unknown) -> ``degraded_failure_rate``, different ->
the stricter ``prompt_mismatch_failure_rate``. So a prompt change alone never demotes a clean artifact, a
prompt change plus poor health does (ADR 0012 section 6). Extrinsic and adaptive failures are not in the
window: they never count toward repair or regeneration.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.store.cacheability import DEFAULT_DYNAMIC_METHODS
from sandforge.runtime.store.logfields import StoreLogFields
from sandforge.runtime.store.models import FailureClass, MethodArtifact, ProgramSource

MAX_REPAIRS_BEFORE_REGEN = 3


class Decision(StrEnum):
    GENERATE = "generate"
    EXECUTE_PERSISTED = "execute_persisted"
    REPAIR = "repair"
    REGENERATE = "regenerate"


class SelectionReason(StrEnum):
    MISSING = "missing"
    CORRUPT = "corrupt"
    RUNTIME_INCOMPATIBLE = "runtime_incompatible"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    DYNAMIC_METHOD = "dynamic_method"
    NON_CACHEABLE = "non_cacheable"
    UNPROVEN = "unproven"
    UNHEALTHY = "unhealthy"
    STALE_CONTRACT = "stale_contract"
    DEGRADED = "degraded"
    REPAIR_BUDGET_EXHAUSTED = "repair_budget_exhausted"
    HEALTHY = "healthy"


class HealthStatus(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNPROVEN = "unproven"


class _Corrupt(enum.Enum):
    CORRUPT = "corrupt"


#: Pass this to :func:`select_artifact` when the stored file existed but could not be used.
CORRUPT = _Corrupt.CORRUPT
StoredArtifact: TypeAlias = MethodArtifact | Literal[_Corrupt.CORRUPT] | None


class SelectionPolicy(BaseModel):
    """Thresholds of the policy. The defaults are the documented behaviour; all are configurable."""

    model_config = ConfigDict(frozen=True)

    max_repairs_before_regen: int = Field(MAX_REPAIRS_BEFORE_REGEN, ge=0)
    degraded_failure_rate: float = Field(0.25, ge=0.0, le=1.0)
    prompt_mismatch_failure_rate: float = Field(0.0, ge=0.0, le=1.0)
    unhealthy_failure_rate: float = Field(0.5, ge=0.0, le=1.0)
    min_samples: int = Field(4, ge=1)
    #: DEGRADED once this many of the artifact's last ADAPTIVE_WINDOW answers were adaptive failures.
    adaptive_degraded_failures: int = Field(3, ge=1)
    dynamic_methods: frozenset[str] = DEFAULT_DYNAMIC_METHODS
    #: exact: versions equal. minor: same MAJOR.MINOR (patch ignored). major: same MAJOR (same MINOR
    #: under 0.x) and not written by a newer runtime.
    runtime_compatibility: Literal["exact", "minor", "major"] = "minor"


DEFAULT_POLICY = SelectionPolicy()

_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def _version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION.match(text.strip())
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def runtime_compatible(stored: str, current: str, mode: Literal["exact", "minor", "major"] = "minor") -> bool:
    """May code stored under runtime ``stored`` run on runtime ``current``? Unparseable: exact match only."""
    if mode == "exact" or stored == current:
        return stored == current
    s, c = _version(stored), _version(current)
    if s is None or c is None:
        return False
    if mode == "minor":
        return s[:2] == c[:2]
    if s[0] != c[0] or s[:2] > c[:2]:
        return False
    return c[0] != 0 or s[1] == c[1]


def prompt_version_matches(artifact: MethodArtifact, prompt_version: str | None) -> bool | None:
    """None when either side is unknown."""
    if prompt_version is None or artifact.prompt_version is None:
        return None
    return artifact.prompt_version == prompt_version


def assess_health(
    artifact: MethodArtifact, *, prompt_version: str | None = None, policy: SelectionPolicy = DEFAULT_POLICY
) -> HealthStatus:
    if artifact.success_count == 0:
        return HealthStatus.UNPROVEN
    rate = artifact.recent_failure_rate
    if len(artifact.recent_outcomes) >= policy.min_samples and rate >= policy.unhealthy_failure_rate:
        return HealthStatus.UNHEALTHY
    if artifact.consecutive_intrinsic_failures > 0 or adaptive_degraded(artifact, policy):
        return HealthStatus.DEGRADED
    mismatch = prompt_version_matches(artifact, prompt_version) is False
    threshold = policy.prompt_mismatch_failure_rate if mismatch else policy.degraded_failure_rate
    return HealthStatus.DEGRADED if rate > threshold else HealthStatus.HEALTHY


def adaptive_degraded(artifact: MethodArtifact, policy: SelectionPolicy = DEFAULT_POLICY) -> bool:
    """Repeated adaptive failures: the stored program keeps giving up on the inputs it gets."""
    return artifact.recent_adaptive.count(True) >= policy.adaptive_degraded_failures


def reuse_allowed(
    artifact: MethodArtifact, method_name: str, dynamic_methods: frozenset[str] = DEFAULT_DYNAMIC_METHODS
) -> tuple[bool, str]:
    """The ADR 0013 reuse gate, with the legacy rule for artifacts that predate cacheability metadata."""
    if method_name in dynamic_methods:
        legacy = " (legacy artifact)" if artifact.cacheable is None else ""
        return False, f"{method_name!r} is a dynamic dispatch method{legacy}; never reused"
    if artifact.cacheable is None:
        return True, "legacy artifact of a stable method; compatibility and health checks apply"
    if not artifact.cacheable:
        return False, f"artifact is not cacheable ({artifact.cacheability_reason or 'no reason recorded'})"
    return True, artifact.cacheability_reason or "cacheable"


class ArtifactObservation(BaseModel):
    """What the selector saw of the stored artifact: the ``artifact_*`` call-log fields (ADR 0012 sec. 10)."""

    model_config = ConfigDict(frozen=True)

    generation: int
    prompt_version: str | None
    contract_fingerprint: str | None
    success_count: int
    failure_count: int
    intrinsic_failure_count: int
    extrinsic_failure_count: int
    adaptive_failure_count: int
    repair_count_since_regen: int
    cacheable: bool | None
    cacheability_reason: str | None
    input_sensitive: bool

    @classmethod
    def of(cls, a: MethodArtifact) -> ArtifactObservation:
        return cls(
            generation=a.generation,
            prompt_version=a.prompt_version,
            contract_fingerprint=a.contract_fingerprint,
            success_count=a.success_count,
            failure_count=a.failure_count,
            intrinsic_failure_count=a.intrinsic_failure_count,
            extrinsic_failure_count=a.extrinsic_failure_count,
            adaptive_failure_count=a.adaptive_failure_count,
            repair_count_since_regen=a.repair_count_since_regen,
            cacheable=a.cacheable,
            cacheability_reason=a.cacheability_reason,
            input_sensitive=a.input_sensitive,
        )


class CallLogFields(StoreLogFields):
    """The ToolStore fields of one dynamic call's log entry (ADR 0012 sec. 10, ADR 0013, plan phase 4), as
    the selection sees them: the call record's store fields plus its program source and failure class,
    with the store's enumerations."""

    model_config = ConfigDict(frozen=True, defer_build=False)  # built at import (its base is not)

    program_source: ProgramSource
    artifact_hit: bool
    selection_decision: Decision  # narrowed from the record's str
    selection_reason: SelectionReason
    failure_class: FailureClass | None = None


class Selection(BaseModel):
    """The decision for one call. ``artifact`` is set only when its code may be used: EXECUTE_PERSISTED
    (run it) and REPAIR (prior code for the repair prompt). ``observed`` is set whenever a parsed artifact
    was present, for the call log, even when its code must not be used."""

    model_config = ConfigDict(frozen=True)

    decision: Decision
    reason: SelectionReason
    detail: str
    health: HealthStatus | None = None
    prompt_version_match: bool | None = None
    #: An intact artifact (present, parsed, runtime-compatible, checksum OK) was found.
    artifact_hit: bool = False
    artifact: MethodArtifact | None = None
    observed: ArtifactObservation | None = None

    @property
    def executable(self) -> bool:
        return self.decision is Decision.EXECUTE_PERSISTED

    def log_fields(
        self,
        *,
        program_source: ProgramSource,
        repair_attempted: bool = False,
        repair_succeeded: bool = False,
        failure_class: FailureClass | None = None,
        capability_patterns: Sequence[str] = (),
        promotion_candidate_capabilities: Sequence[str] = (),
    ) -> CallLogFields:
        o = self.observed
        return CallLogFields(
            program_source=program_source,
            artifact_hit=self.artifact_hit,
            artifact_generation=o.generation if o else None,
            artifact_prompt_version=o.prompt_version if o else None,
            artifact_contract_fingerprint=o.contract_fingerprint if o else None,
            artifact_success_count=o.success_count if o else None,
            artifact_failure_count=o.failure_count if o else None,
            artifact_intrinsic_failure_count=o.intrinsic_failure_count if o else None,
            artifact_extrinsic_failure_count=o.extrinsic_failure_count if o else None,
            artifact_cacheable=o.cacheable if o else None,
            artifact_cacheability_reason=o.cacheability_reason if o else None,
            artifact_input_sensitive=o.input_sensitive if o else None,
            selection_decision=self.decision,
            selection_reason=self.reason,
            repair_attempted=repair_attempted,
            repair_succeeded=repair_succeeded,
            failure_class=failure_class,
            capability_patterns=list(capability_patterns),
            promotion_candidate_detected=bool(promotion_candidate_capabilities),
            promotion_candidate_capabilities=list(promotion_candidate_capabilities),
        )


def select_artifact(
    stored: StoredArtifact,
    *,
    method_name: str,
    contract_fingerprint: str | None,
    runtime_version: str,
    prompt_version: str | None = None,
    policy: SelectionPolicy = DEFAULT_POLICY,
) -> Selection:
    """Decide how to serve a call of ``method_name`` given what the store holds (see the module table)."""
    D, R = Decision, SelectionReason
    if stored is None:
        return Selection(decision=D.GENERATE, reason=R.MISSING, detail="no stored artifact")
    if stored is CORRUPT:
        return Selection(decision=D.GENERATE, reason=R.CORRUPT, detail="stored artifact unreadable; quarantined")
    artifact: MethodArtifact = stored
    observed = ArtifactObservation.of(artifact)
    unusable = _unusable(artifact, method_name=method_name, runtime_version=runtime_version, policy=policy)
    if unusable is not None:
        reason, detail = unusable
        return Selection(decision=D.GENERATE, reason=reason, detail=detail, observed=observed)

    health = assess_health(artifact, prompt_version=prompt_version, policy=policy)
    common = {
        "health": health,
        "prompt_version_match": prompt_version_matches(artifact, prompt_version),
        "artifact_hit": True,
        "observed": observed,
    }
    allowed, why = reuse_allowed(artifact, method_name, policy.dynamic_methods)
    if not allowed:
        reason = R.DYNAMIC_METHOD if method_name in policy.dynamic_methods else R.NON_CACHEABLE
        return Selection(decision=D.REGENERATE, reason=reason, detail=why, **common)
    if health is HealthStatus.UNPROVEN:
        return Selection(decision=D.REGENERATE, reason=R.UNPROVEN, detail="no successful run on record", **common)
    if health is HealthStatus.UNHEALTHY:
        return Selection(
            decision=D.REGENERATE,
            reason=R.UNHEALTHY,
            detail=f"intrinsic failure rate {artifact.recent_failure_rate:.0%} over the last "
            f"{len(artifact.recent_outcomes)} runs",
            **common,
        )

    stale = artifact.contract_fingerprint != contract_fingerprint
    if stale or health is HealthStatus.DEGRADED:
        return _repair_or_regenerate(artifact, stale=stale, policy=policy, common=common)

    return Selection(
        decision=D.EXECUTE_PERSISTED, reason=R.HEALTHY, detail="healthy and cacheable", artifact=artifact, **common
    )


def _unusable(
    artifact: MethodArtifact, *, method_name: str, runtime_version: str, policy: SelectionPolicy
) -> tuple[SelectionReason, str] | None:
    """Why ``artifact`` cannot be served at all (another method, another runtime, damaged code), if it cannot."""
    if artifact.method_name != method_name:
        return (
            SelectionReason.CORRUPT,
            f"stored artifact is for method {artifact.method_name!r}, not {method_name!r}",
        )
    if not runtime_compatible(artifact.runtime_version, runtime_version, policy.runtime_compatibility):
        return (
            SelectionReason.RUNTIME_INCOMPATIBLE,
            f"written for runtime {artifact.runtime_version!r}, running {runtime_version!r}",
        )
    if not artifact.checksum_ok():
        return (
            SelectionReason.CHECKSUM_MISMATCH,
            "code does not match code_checksum: modified or damaged, not executed",
        )
    return None


def _repair_or_regenerate(
    artifact: MethodArtifact, *, stale: bool, policy: SelectionPolicy, common: dict[str, Any]
) -> Selection:
    """A stale or degraded artifact: repaired while the repair budget lasts, regenerated after."""
    D, R = Decision, SelectionReason
    trigger = R.STALE_CONTRACT if stale else R.DEGRADED
    what = (
        "contract changed since the code was written"
        if stale
        else f"degraded: {artifact.consecutive_intrinsic_failures} consecutive intrinsic failure(s), "
        f"rate {artifact.recent_failure_rate:.0%}, {artifact.recent_adaptive.count(True)} adaptive failure(s) "
        f"in the last {len(artifact.recent_adaptive)} answers"
    )
    if artifact.repair_count_since_regen >= policy.max_repairs_before_regen:
        return Selection(
            decision=D.REGENERATE,
            reason=R.REPAIR_BUDGET_EXHAUSTED,
            detail=f"{what}; repair budget spent ({artifact.repair_count_since_regen}/"
            f"{policy.max_repairs_before_regen})",
            **common,
        )
    return Selection(decision=D.REPAIR, reason=trigger, detail=what, artifact=artifact, **common)
