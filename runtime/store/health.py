"""Pure health bookkeeping of method artifacts: each function returns an updated copy, nothing is written.

``ToolStore.record_*`` apply these under the store lock. The rules:

- success: ``success_count``, ``usage``/``last_used_at``; the outcome window gets True; the run of
  consecutive intrinsic failures ends.
- failure: ``failure_count`` and the per-class counter, ``last_failure_reason``/``last_failure_class``.
  Only an INTRINSIC failure enters the outcome window (so only it moves ``recent_failure_rate``) and
  extends ``consecutive_intrinsic_failures``. An ADAPTIVE failure enters ``recent_adaptive`` (the last
  ADAPTIVE_WINDOW answers, successes too): one is the tool's answer, but repeated ones (3 of the last 5 by
  default, ``SelectionPolicy.adaptive_degraded_failures``) degrade the artifact, so repair and forced
  regeneration apply. Extrinsic failures never demote an artifact.
- a new generation (:func:`promote`) starts its own health (one success: it is committed after its first
  successful run). A REPAIRED one inherits the repair budget spent (``repair_count_since_regen + 1``); a
  GENERATED one (generation or regeneration) resets it to 0.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandforge.runtime.environments.identity import EnvironmentSpec
from sandforge.runtime.store.cacheability import Cacheability
from sandforge.runtime.store.fingerprint import code_checksum
from sandforge.runtime.store.kinds import ADAPTIVE_ERROR_TYPES as ADAPTIVE_ERROR_TYPES  # the classification: kinds.py
from sandforge.runtime.store.kinds import EXTRINSIC_ERROR_TYPES as EXTRINSIC_ERROR_TYPES
from sandforge.runtime.store.kinds import FailureClass, ProgramSource
from sandforge.runtime.store.kinds import classify_failure as classify_failure
from sandforge.runtime.store.kinds import classify_outcome as classify_outcome
from sandforge.runtime.store.models import ADAPTIVE_WINDOW, HEALTH_WINDOW, MAX_REASON_CHARS, MethodArtifact


class ArtifactCandidate(BaseModel):
    """Code that just ran successfully and is to be stored (what the lifecycle hands to the store)."""

    model_config = ConfigDict(frozen=True)

    role: str
    method_name: str
    code: str
    runtime_version: str
    cacheability: Cacheability
    dependencies: list[str] = Field(default_factory=list)
    #: the environment it ran with (issue 19): its spec, pins included, so it always runs with exactly that
    environment: EnvironmentSpec | None = None
    prompt_version: str | None = None
    model: str | None = None
    contract_fingerprint: str | None = None
    capabilities: list[str] = Field(default_factory=list)

    @field_validator("role", "method_name", "code")
    @classmethod
    def _utf8(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("not valid unicode (lone surrogate)") from exc
        return value


def clean_text(text: str) -> str:
    """``text`` with anything not encodable as UTF-8 (lone surrogates) replaced, so it can be stored."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _window(outcomes: list[bool], outcome: bool, count: int = 1) -> tuple[list[bool], float]:
    window = [*outcomes, *[outcome] * min(count, HEALTH_WINDOW)][-HEALTH_WINDOW:]
    return window, round(window.count(False) / len(window), 4)


def _adaptive_window(answers: list[bool], adaptive: bool, count: int = 1) -> list[bool]:
    return [*answers, *[adaptive] * min(count, ADAPTIVE_WINDOW)][-ADAPTIVE_WINDOW:]


def _clip(reason: str) -> str:
    reason = clean_text(reason).strip() or "unknown failure"
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def apply_success(artifact: MethodArtifact, now: datetime, count: int = 1) -> MethodArtifact:
    """``count`` successes in a row (a writer may coalesce several into one update)."""
    if count < 1:
        raise ValueError("count must be at least 1")
    window, rate = _window(artifact.recent_outcomes, True, count)
    return artifact.model_copy(
        update={
            "success_count": artifact.success_count + count,
            "recent_outcomes": window,
            "recent_failure_rate": rate,
            "consecutive_intrinsic_failures": 0,
            "recent_adaptive": _adaptive_window(artifact.recent_adaptive, False, count),
            "last_used_at": now,
        }
    )


def apply_failure(
    artifact: MethodArtifact, failure_class: FailureClass | str, reason: str, now: datetime
) -> MethodArtifact:
    """``failure_class`` may be any str enum or string with the values intrinsic/extrinsic/adaptive."""
    failure_class = FailureClass(str(failure_class))
    update: dict[str, object] = {
        "failure_count": artifact.failure_count + 1,
        "last_failure_reason": _clip(reason),
        "last_failure_class": failure_class,
        "last_used_at": now,
    }
    if failure_class is FailureClass.INTRINSIC:
        window, rate = _window(artifact.recent_outcomes, False)
        update |= {
            "intrinsic_failure_count": artifact.intrinsic_failure_count + 1,
            "recent_outcomes": window,
            "recent_failure_rate": rate,
            "consecutive_intrinsic_failures": artifact.consecutive_intrinsic_failures + 1,
        }
    elif failure_class is FailureClass.EXTRINSIC:
        update["extrinsic_failure_count"] = artifact.extrinsic_failure_count + 1
    else:
        update["adaptive_failure_count"] = artifact.adaptive_failure_count + 1
        update["recent_adaptive"] = _adaptive_window(artifact.recent_adaptive, True)
    return artifact.model_copy(update=update)


def promote(
    candidate: ArtifactCandidate,
    *,
    source: ProgramSource,
    generation: int,
    previous: MethodArtifact | None,
    now: datetime,
) -> MethodArtifact:
    """A new generation from ``candidate``; ``previous`` is the generation it replaces (if any)."""
    if source is ProgramSource.PERSISTED:
        raise ValueError("a new generation is GENERATED or REPAIRED, never PERSISTED")
    repaired = source is ProgramSource.REPAIRED
    repairs = (previous.repair_count_since_regen + 1 if previous else 1) if repaired else 0
    return MethodArtifact(
        role=candidate.role,
        method_name=candidate.method_name,
        generation=generation,
        code=candidate.code,
        dependencies=list(candidate.dependencies),
        environment=candidate.environment,
        prompt_version=candidate.prompt_version,
        runtime_version=candidate.runtime_version,
        model=candidate.model,
        code_checksum=code_checksum(candidate.code),
        contract_fingerprint=candidate.contract_fingerprint,
        program_source=source,
        capabilities=sorted(set(candidate.capabilities)),
        cacheable=candidate.cacheability.cacheable,
        cacheability_reason=candidate.cacheability.reason_text,
        input_sensitive=candidate.cacheability.input_sensitive,
        success_count=1,
        recent_outcomes=[True],
        recent_failure_rate=0.0,
        created_at=now,
        last_used_at=now,
        last_repaired_at=now if repaired else None,
        last_regenerated_at=(previous.last_regenerated_at if previous else None) if repaired else now,
        repair_count_since_regen=repairs,
    )
