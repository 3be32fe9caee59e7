"""Every branch of the selection policy, as pure functions (no files)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sandforge.runtime.store import (
    CORRUPT,
    MAX_REPAIRS_BEFORE_REGEN,
    Decision,
    FailureClass,
    HealthStatus,
    MethodArtifact,
    ProgramSource,
    SelectionPolicy,
    SelectionReason,
    apply_failure,
    apply_success,
    assess_health,
    promote,
    runtime_compatible,
    select_artifact,
)
from tests.store.conftest import RUNTIME, WEB_FETCHER, candidate

NOW = datetime(2026, 2, 15, tzinfo=UTC)
FP = WEB_FETCHER.fingerprint()


def artifact(**kw: object) -> MethodArtifact:
    art = promote(candidate(), source=ProgramSource.GENERATED, generation=1, previous=None, now=NOW)
    return art.model_copy(update=kw) if kw else art


def select(stored: object, method: str = "fetch_url", **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"contract_fingerprint": FP, "runtime_version": RUNTIME, "prompt_version": "p1"}
    args.update(kw)
    return select_artifact(stored, method_name=method, **args)  # type: ignore[arg-type]


def fail(art: MethodArtifact, n: int = 1, cls: FailureClass = FailureClass.INTRINSIC) -> MethodArtifact:
    for _ in range(n):
        art = apply_failure(art, cls, "boom", NOW)
    return art


def succeed(art: MethodArtifact, n: int = 1) -> MethodArtifact:
    for _ in range(n):
        art = apply_success(art, NOW)
    return art


# --- generate ---------------------------------------------------------------------------------------------


def test_missing_generates() -> None:
    s = select(None)
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.MISSING)
    assert s.artifact is None and not s.artifact_hit and not s.executable


def test_corrupt_generates() -> None:
    s = select(CORRUPT)
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.CORRUPT)


def test_artifact_of_another_method_is_treated_as_corrupt() -> None:
    s = select(artifact(), method="other")
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.CORRUPT)


def test_runtime_incompatible_generates() -> None:
    s = select(artifact(runtime_version="0.2.0"))
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.RUNTIME_INCOMPATIBLE)
    assert s.artifact is None


def test_checksum_mismatch_generates_and_never_hands_out_the_code() -> None:
    tampered = artifact(code=artifact().code + "\nimport os\n")
    s = select(tampered)
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.CHECKSUM_MISMATCH)
    assert s.artifact is None and not s.executable and not s.artifact_hit
    assert s.observed is not None  # counts still reach the call log


# --- execute -----------------------------------------------------------------------------------------------


def test_healthy_cacheable_executes_persisted() -> None:
    s = select(artifact())
    assert (s.decision, s.reason) == (Decision.EXECUTE_PERSISTED, SelectionReason.HEALTHY)
    assert s.executable and s.artifact_hit and s.artifact is not None
    assert s.health is HealthStatus.HEALTHY


def test_patch_level_runtime_difference_still_executes() -> None:
    assert select(artifact(runtime_version="0.1.7")).decision is Decision.EXECUTE_PERSISTED


def test_prompt_version_mismatch_alone_never_invalidates() -> None:
    s = select(succeed(artifact(), 5), prompt_version="p2")
    assert s.decision is Decision.EXECUTE_PERSISTED
    assert s.prompt_version_match is False


def test_extrinsic_and_occasional_adaptive_failures_do_not_count() -> None:
    art = fail(artifact(), 10, FailureClass.EXTRINSIC)
    for _ in range(5):  # 2 adaptive failures in every 5 answers stay under the threshold (3 of 5)
        art = succeed(fail(succeed(fail(art, 1, FailureClass.ADAPTIVE)), 1, FailureClass.ADAPTIVE))
    assert art.failure_count == 20 and art.intrinsic_failure_count == 0
    assert art.recent_failure_rate == 0.0
    assert select(art).decision is Decision.EXECUTE_PERSISTED


def test_repeated_adaptive_failures_degrade_then_force_regeneration() -> None:
    art = fail(succeed(artifact()), 3, FailureClass.ADAPTIVE)
    s = select(art)
    assert s.decision is Decision.REPAIR and s.reason is SelectionReason.DEGRADED
    assert "3 adaptive failure(s)" in s.detail
    spent = art.model_copy(update={"repair_count_since_regen": MAX_REPAIRS_BEFORE_REGEN})
    assert select(spent).reason is SelectionReason.REPAIR_BUDGET_EXHAUSTED
    assert select(succeed(art, 3)).decision is Decision.EXECUTE_PERSISTED  # the window moved on


def test_legacy_stable_artifact_without_cacheability_executes() -> None:
    s = select(artifact(cacheable=None, cacheability_reason=None))
    assert s.decision is Decision.EXECUTE_PERSISTED


# --- repair ------------------------------------------------------------------------------------------------


def test_stale_contract_repairs() -> None:
    s = select(artifact(), contract_fingerprint="0" * 64)
    assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.STALE_CONTRACT)
    assert s.artifact is not None  # prior code for the repair prompt


def test_intrinsic_failure_degrades_and_repairs() -> None:
    s = select(fail(succeed(artifact(), 5)))
    assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.DEGRADED)
    assert s.health is HealthStatus.DEGRADED


def test_success_after_a_failure_recovers_when_rate_is_low() -> None:
    art = succeed(fail(succeed(artifact(), 6)))  # 1 failure in 9 -> 11%
    assert select(art).decision is Decision.EXECUTE_PERSISTED


def test_prompt_mismatch_combined_with_poor_health_repairs() -> None:
    art = succeed(fail(succeed(artifact(), 6)))  # healthy with the same prompt...
    assert select(art, prompt_version="p1").decision is Decision.EXECUTE_PERSISTED
    s = select(art, prompt_version="p2")  # ...but a prompt change plus any failure is poor health
    assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.DEGRADED)


# --- regenerate --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ask", "chat", "discuss", "host"])
def test_dynamic_methods_are_never_reused(method: str) -> None:
    s = select(artifact(method_name=method), method=method)
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.DYNAMIC_METHOD)
    assert s.artifact is None


def test_legacy_dynamic_artifact_is_not_reused() -> None:
    s = select(artifact(method_name="ask", cacheable=None, cacheability_reason=None), method="ask")
    assert s.decision is Decision.REGENERATE
    assert "legacy" in s.detail


def test_dynamic_method_set_is_configurable() -> None:
    policy = SelectionPolicy(dynamic_methods=frozenset({"fetch_url"}))
    assert select(artifact(), policy=policy).decision is Decision.REGENERATE
    assert select(
        artifact(method_name="ask"), method="ask", policy=SelectionPolicy(dynamic_methods=frozenset())
    ).decision is (Decision.EXECUTE_PERSISTED)


def test_non_cacheable_regenerates() -> None:
    s = select(artifact(cacheable=False, cacheability_reason="input_baked: x"))
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.NON_CACHEABLE)


def test_unproven_regenerates() -> None:
    s = select(artifact(success_count=0, recent_outcomes=[]))
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.UNPROVEN)


def test_unhealthy_regenerates_even_with_budget_left() -> None:
    art = fail(artifact(), 3)  # 3 of 4 intrinsic failures
    assert assess_health(art) is HealthStatus.UNHEALTHY
    s = select(art)
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.UNHEALTHY)


@pytest.mark.parametrize("stale", [False, True])
def test_repair_budget_exhausted_forces_regeneration(stale: bool) -> None:
    art = artifact(repair_count_since_regen=3)
    art = art if stale else fail(succeed(art, 5))
    s = select(art, contract_fingerprint="0" * 64 if stale else FP)
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.REPAIR_BUDGET_EXHAUSTED)


def test_budget_is_only_checked_when_repair_is_needed() -> None:
    assert select(artifact(repair_count_since_regen=99)).decision is Decision.EXECUTE_PERSISTED


def test_budget_below_limit_still_repairs() -> None:
    assert select(fail(succeed(artifact(repair_count_since_regen=2), 5))).decision is Decision.REPAIR


# --- helpers -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "current", "mode", "ok"),
    [
        ("0.1.0", "0.1.0", "exact", True),
        ("0.1.0", "0.1.1", "exact", False),
        ("0.1.0", "0.1.9", "minor", True),
        ("0.1.0", "0.2.0", "minor", False),
        ("1.2.0", "1.4.0", "major", True),
        ("1.5.0", "1.4.0", "major", False),
        ("0.1.0", "0.2.0", "major", False),
        ("2.0.0", "1.0.0", "major", False),
        ("nightly", "nightly", "minor", True),
        ("nightly", "0.1.0", "minor", False),
    ],
)
def test_runtime_compatible(stored: str, current: str, mode: str, ok: bool) -> None:
    assert runtime_compatible(stored, current, mode) is ok  # type: ignore[arg-type]


def test_log_fields_carry_adr_0012_section_10() -> None:
    s = select(fail(succeed(artifact(), 2), 1, FailureClass.EXTRINSIC))
    fields = s.log_fields(program_source=ProgramSource.PERSISTED, promotion_candidate_capabilities=["rss_parse"])
    dumped = fields.model_dump(mode="json")
    for key in (
        "program_source",
        "artifact_hit",
        "artifact_prompt_version",
        "artifact_contract_fingerprint",
        "artifact_success_count",
        "artifact_failure_count",
        "artifact_intrinsic_failure_count",
        "artifact_extrinsic_failure_count",
        "repair_attempted",
        "repair_succeeded",
        "failure_class",
        "artifact_cacheable",
        "promotion_candidate_detected",
        "promotion_candidate_capabilities",
    ):
        assert key in dumped
    assert dumped["program_source"] == "persisted" and dumped["artifact_hit"] is True
    assert dumped["artifact_extrinsic_failure_count"] == 1
    assert dumped["promotion_candidate_detected"] is True
