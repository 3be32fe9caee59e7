"""ToolStore behaviour the ADRs name: reuse across instances, tamper, repair budget, retention, rollback."""

from __future__ import annotations

import json

import pytest

from sandforge.runtime.store import (
    MAX_REPAIRS_BEFORE_REGEN,
    RETAINED_PREVIOUS,
    Decision,
    FailureClass,
    ProgramSource,
    RollbackError,
    SelectionReason,
    ToolContract,
    ToolNotFoundError,
    ToolStore,
    assess_cacheability,
    classify_failure,
)
from tests.store.conftest import RUNTIME, WEB_FETCHER, Clock, candidate

FP = WEB_FETCHER.fingerprint()


def select(store: ToolStore, role: str = "web_fetcher", method: str = "fetch_url", **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"contract_fingerprint": FP, "runtime_version": RUNTIME, "prompt_version": "p1"}
    args.update(kw)
    return store.select(role, method, **args)  # type: ignore[arg-type]


def test_artifact_saved_after_success_is_reused_by_a_new_store_instance(store: ToolStore) -> None:
    assert select(store).decision is Decision.GENERATE
    saved = store.record_regeneration(candidate())
    assert saved.program_source is ProgramSource.GENERATED and saved.success_count == 1

    restarted = ToolStore(store.paths.state_dir)  # a new process/session on the same store
    s = select(restarted)
    assert s.decision is Decision.EXECUTE_PERSISTED
    assert s.artifact is not None and s.artifact.code == saved.code
    assert s.log_fields(program_source=ProgramSource.PERSISTED).program_source is ProgramSource.PERSISTED


def test_tampered_code_is_not_executed(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    path = store.paths.method_file("web_fetcher", "fetch_url")
    data = json.loads(path.read_text())
    data["current"]["code"] = "import os\nreturn os.listdir('/')"
    path.write_text(json.dumps(data))
    s = select(ToolStore(store.paths.state_dir))
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.CHECKSUM_MISMATCH)
    assert s.artifact is None
    # regeneration replaces it; the tampered generation stays inspectable in history
    store.record_regeneration(candidate())
    assert select(store).decision is Decision.EXECUTE_PERSISTED
    assert not store.history("web_fetcher", "fetch_url")[1].checksum_ok()


def test_repair_then_forced_regeneration_at_the_budget(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    for n in range(1, MAX_REPAIRS_BEFORE_REGEN + 1):
        store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, f"KeyError #{n}")
        s = select(store)
        assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.DEGRADED)
        assert s.artifact is not None and s.artifact.last_failure_reason == f"KeyError #{n}"
        repaired = store.record_repair(candidate(code=f"# repair {n}\n" + s.artifact.code))
        assert repaired.repair_count_since_regen == n
        assert repaired.program_source is ProgramSource.REPAIRED
        assert select(store).decision is Decision.EXECUTE_PERSISTED
    store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, "again")
    s = select(store)
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.REPAIR_BUDGET_EXHAUSTED)
    fresh = store.record_regeneration(candidate(code="return 'rewritten'"))
    assert fresh.repair_count_since_regen == 0 and fresh.last_regenerated_at is not None
    assert select(store).decision is Decision.EXECUTE_PERSISTED


def test_extrinsic_failures_are_not_counted_toward_regeneration(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    for _ in range(20):
        store.record_failure("web_fetcher", "fetch_url", classify_failure("timeout"), "sandbox timed out")
    art = store.lookup("web_fetcher", "fetch_url").artifact
    assert art is not None
    assert (art.failure_count, art.extrinsic_failure_count, art.intrinsic_failure_count) == (20, 20, 0)
    assert art.last_failure_class is FailureClass.EXTRINSIC
    assert select(store).decision is Decision.EXECUTE_PERSISTED
    entry = store.get_tool("web_fetcher")
    assert entry is not None and entry.failure_count == 20 and entry.intrinsic_failure_count == 0


def test_classify_failure() -> None:
    assert classify_failure("sandbox_unavailable") is FailureClass.EXTRINSIC
    assert classify_failure("missing_input") is FailureClass.ADAPTIVE
    assert classify_failure("execution") is FailureClass.INTRINSIC
    assert classify_failure(None) is FailureClass.INTRINSIC


def test_google_then_yahoo_generates_twice(store: ToolStore) -> None:
    for query, site in (("latest on Google News?", "google"), ("latest on Yahoo News?", "yahoo")):
        s = select(store, role="assistant", method="ask", contract_fingerprint=None)
        assert s.decision in (Decision.GENERATE, Decision.REGENERATE)
        assert not s.executable
        code = f"return Outcome.ok(fetch('https://news.{site}.com/rss'))"
        cache = assess_cacheability("ask", code, [query], {})
        store.record_regeneration(
            candidate(role="assistant", method="ask", code=code, fingerprint=None).model_copy(
                update={"cacheability": cache}
            )
        )
    history = store.history("assistant", "ask")
    assert [a.cacheable for a in history] == [False, False]  # persisted, never reusable
    assert "yahoo" in history[0].code and "google" in history[1].code


def test_stable_tool_reuses_across_different_urls(store: ToolStore) -> None:
    store.record_regeneration(candidate(args=["https://a.example/"]))
    assert select(store).decision is Decision.EXECUTE_PERSISTED  # url2 call: same artifact, url is an argument


def test_retention_keeps_latest_plus_previous_two(store: ToolStore) -> None:
    for n in range(1, 6):
        store.record_regeneration(candidate(code=f"return {n}"))
    history = store.history("web_fetcher", "fetch_url")
    assert len(history) == 1 + RETAINED_PREVIOUS == 3
    assert [a.generation for a in history] == [5, 4, 3]
    assert [a.code for a in history] == ["return 5", "return 4", "return 3"]


def test_rollback_to_previous_and_back(store: ToolStore, clock: Clock) -> None:
    for n in range(1, 4):
        store.record_regeneration(candidate(code=f"return {n}"))
    store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, "regressed")
    restored = store.rollback("web_fetcher", "fetch_url")
    assert restored.generation == 2 and restored.code == "return 2"
    assert [a.generation for a in store.history("web_fetcher", "fetch_url")] == [2, 3, 1]
    assert select(store).decision is Decision.EXECUTE_PERSISTED
    # the rollback itself is reversible
    assert store.rollback("web_fetcher", "fetch_url").generation == 3
    # and a named generation can be restored
    assert store.rollback("web_fetcher", "fetch_url", to=1).code == "return 1"
    # new generations keep counting up, never reusing a number
    assert store.record_regeneration(candidate(code="return 4")).generation == 4


def test_rollback_refusals(store: ToolStore) -> None:
    with pytest.raises(ToolNotFoundError):
        store.rollback("web_fetcher", "fetch_url")
    store.record_regeneration(candidate(code="return 1"))
    with pytest.raises(RollbackError, match="no earlier generation"):
        store.rollback("web_fetcher", "fetch_url")
    store.record_regeneration(candidate(code="return 2"))
    with pytest.raises(RollbackError, match="already current"):
        store.rollback("web_fetcher", "fetch_url", to=2)
    with pytest.raises(RollbackError, match="not retained") as info:
        store.rollback("web_fetcher", "fetch_url", to=7)
    assert info.value.hint and "1" in info.value.hint
    # a tampered earlier generation is not restored
    path = store.paths.method_file("web_fetcher", "fetch_url")
    data = json.loads(path.read_text())
    data["history"][0]["code"] = "evil()"
    path.write_text(json.dumps(data))
    with pytest.raises(RollbackError, match="checksum"):
        store.rollback("web_fetcher", "fetch_url")


def test_outcome_recorded_against_the_generation_that_ran(store: ToolStore) -> None:
    first = store.record_regeneration(candidate(code="return 1"))
    store.record_regeneration(candidate(code="return 2"))  # another process replaced it meanwhile
    updated = store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, "x", generation=first.generation)
    assert updated is not None and updated.generation == 1 and updated.failure_count == 1
    current = store.lookup("web_fetcher", "fetch_url").artifact
    assert current is not None and current.failure_count == 0
    assert store.record_success("web_fetcher", "fetch_url", generation=99) is None
    assert store.record_success("nobody", "nothing") is None


def test_usage_and_recency_update_the_registry(store: ToolStore, clock: Clock) -> None:
    store.register_tool(WEB_FETCHER)
    entry = store.get_tool("web_fetcher")
    assert entry is not None and entry.usage_count == 0 and entry.last_used_at is None
    store.record_regeneration(candidate())
    t = clock.advance(hours=1)
    art = store.record_success("web_fetcher", "fetch_url")
    assert art is not None and art.last_used_at == t and art.success_count == 2
    entry = store.get_tool("web_fetcher")
    assert entry is not None
    assert (entry.usage_count, entry.success_count, entry.last_used_at) == (2, 2, t)
    assert entry.contract_fingerprint == FP and entry.methods == ["fetch_url"]


def test_register_tool_updates_contract_and_keeps_counts(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    changed = ToolContract(role="web_fetcher", purpose="Fetch a URL, following redirects")
    entry = store.register_tool(changed)
    assert entry.usage_count == 1 and entry.purpose == changed.purpose
    assert entry.contract_fingerprint == changed.fingerprint() != FP
    s = select(store, contract_fingerprint=changed.fingerprint())
    assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.STALE_CONTRACT)


def test_registry_fields_of_adr_0012(store: ToolStore) -> None:
    entry = store.register_tool(WEB_FETCHER)
    dumped = entry.model_dump()
    for key in (
        "role",
        "purpose",
        "deliverable",
        "acceptance",
        "failure_policy",
        "created_at",
        "last_used_at",
        "usage_count",
        "schema_version",
    ):
        assert key in dumped


def test_artifact_fields_of_adr_0012_and_0013(store: ToolStore) -> None:
    dumped = store.record_regeneration(candidate()).model_dump()
    for key in (
        "role",
        "method_name",
        "code",
        "dependencies",
        "prompt_version",
        "runtime_version",
        "model",
        "code_checksum",
        "contract_fingerprint",
        "success_count",
        "failure_count",
        "intrinsic_failure_count",
        "extrinsic_failure_count",
        "recent_failure_rate",
        "last_failure_reason",
        "last_failure_class",
        "created_at",
        "last_used_at",
        "last_repaired_at",
        "repair_count_since_regen",
        "cacheable",
        "cacheability_reason",
        "input_sensitive",
        "capabilities",
        "program_source",
        "schema_version",
    ):
        assert key in dumped


def test_health_report(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    store.record_regeneration(candidate(role="assistant", method="ask", fingerprint=None))
    rows = store.health_report()
    assert [(r.role, r.method_name, r.reusable) for r in rows] == [
        ("assistant", "ask", False),
        ("web_fetcher", "fetch_url", True),
    ]
    with pytest.raises(ToolNotFoundError):
        store.health_report(["nope"])


def test_prune_is_a_dry_run_by_default_and_archives_before_delete(store: ToolStore, clock: Clock) -> None:
    store.record_regeneration(candidate(role="old_tool", fingerprint=None))
    clock.advance(days=100)
    store.record_regeneration(candidate())
    plan = store.prune(older_than_days=90)
    assert not plan.applied and [c.role for c in plan.candidates] == ["old_tool"]
    assert store.get_tool("old_tool") is not None and store.paths.role_dir("old_tool").is_dir()

    applied = store.prune(older_than_days=90, apply=True)
    assert applied.applied and applied.archive_dir is not None
    assert store.get_tool("old_tool") is None and store.get_tool("web_fetcher") is not None
    assert not store.paths.role_dir("old_tool").exists()
    archived = store.paths.archive / applied.archive_dir.rsplit("/", 1)[-1]
    role_archive = next(archived.iterdir())
    assert (role_archive / "registry-entry.json").is_file() and (role_archive / "manifest.json").is_file()
    # pruned roles are not resurrected by a registry rebuild (the archive is a dot-directory)
    store.paths.registry.unlink()
    assert [t.role for t in ToolStore(store.paths.state_dir).list_tools()] == ["web_fetcher"]


def test_capability_index_counts_only_reusable_artifacts(store: ToolStore) -> None:
    store.record_regeneration(candidate(capabilities=["http_fetch"]))
    store.record_regeneration(candidate(role="assistant", method="ask", fingerprint=None, capabilities=["rss_parse"]))
    assert store.capability_index() == {"http_fetch": ["web_fetcher"]}
    assert store.capability_index(exclude_role="web_fetcher") == {}


def test_text_that_is_not_valid_unicode_is_refused_or_cleaned(store: ToolStore) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="surrogate"):
        candidate(code="return '\ud800'")
    store.record_regeneration(candidate())
    art = store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, "bad \udc80 byte")
    assert art is not None and art.last_failure_reason == "bad ? byte"
    store.record_pattern("assistant", "ask", ["http_fetch"], ok=False, error_type="weird\udc80")
    assert store.patterns.events("assistant")[0].error_type == "weird?"


def test_failure_class_from_another_enum_or_string_is_accepted(store: ToolStore) -> None:
    from enum import StrEnum

    class OtherFailureClass(StrEnum):  # e.g. the lifecycle's own enum with the same values
        INTRINSIC = "intrinsic"

    store.record_regeneration(candidate())
    art = store.record_failure("web_fetcher", "fetch_url", OtherFailureClass.INTRINSIC, "x")
    assert art is not None and art.intrinsic_failure_count == 1 and art.adaptive_failure_count == 0
    art = store.record_failure("web_fetcher", "fetch_url", "extrinsic", "y")
    assert art is not None and art.extrinsic_failure_count == 1
    with pytest.raises(ValueError):
        store.record_failure("web_fetcher", "fetch_url", "cosmic", "z")
