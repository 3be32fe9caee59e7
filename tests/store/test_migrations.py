"""schema_version on every record: older versions migrated on load, newer ones refused with a typed error."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sandforge.runtime.store import (
    Decision,
    SchemaTooNewError,
    ToolStore,
    code_checksum,
    select_artifact,
)
from sandforge.runtime.store.migrations import METHOD, REGISTRY, CorruptRecord, decode
from tests.store.conftest import RUNTIME, WEB_FETCHER, candidate

LEGACY_ASK = "return Outcome.ok(fetch('https://news.google.com/rss'))"
LEGACY_FETCH = "return Outcome.ok(tool('http').get(args[0]))"


def _write(path: Path, payload: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def _v1_artifact(role: str, method: str, code: str, **extra: object) -> dict[str, object]:
    return {
        "role": role,
        "method_name": method,
        "code": code,
        "dependencies": [],
        "prompt_version": "p0",
        "runtime_version": RUNTIME,
        "model": "old-model",
        "code_checksum": code_checksum(code),
        "contract_fingerprint": None,
        "success_count": 8,
        "failure_count": 2,
        "intrinsic_failure_count": 2,
        "extrinsic_failure_count": 0,
        "recent_failure_rate": 0.2,
        "last_failure_reason": "KeyError",
        "last_failure_class": "intrinsic",
        "created_at": "2025-12-01T10:00:00",  # naive: older writers
        "last_used_at": "2026-01-01T10:00:00Z",
        "last_repaired_at": None,
        "repair_count_since_regen": 1,
        **extra,
    }


@pytest.fixture
def legacy_store(state_dir: Path) -> Path:
    """A v1 store: no schema_version anywhere, ADR 0012 fields only, no cacheability metadata."""
    s = ToolStore(state_dir)
    _write(
        s.paths.legacy_registry,
        {
            "tools": {
                "web_fetcher": {
                    "role": "web_fetcher",
                    "purpose": "Fetch a URL",
                    "deliverable": "string",
                    "acceptance": "non-empty",
                    "failure_policy": "retry",
                    "created_at": "2025-12-01T10:00:00",
                    "last_used_at": None,
                    "usage_count": 10,
                }
            }
        },
    )
    _write(s.paths.manifest("web_fetcher"), {"role": "web_fetcher", "methods": ["fetch_url"]})
    _write(s.paths.method_file("web_fetcher", "fetch_url"), _v1_artifact("web_fetcher", "fetch_url", LEGACY_FETCH))
    _write(s.paths.method_file("assistant", "ask"), _v1_artifact("assistant", "ask", LEGACY_ASK))
    return state_dir


def test_v1_registry_is_migrated(legacy_store: Path) -> None:
    entry = ToolStore(legacy_store).get_tool("web_fetcher")
    assert entry is not None
    assert entry.schema_version == 2 and entry.usage_count == 10 and entry.purpose == "Fetch a URL"
    assert entry.created_at.tzinfo is not None  # naive timestamps are read as UTC


def test_v1_manifest_is_migrated(legacy_store: Path) -> None:
    manifest = ToolStore(legacy_store).manifest("web_fetcher")
    assert manifest is not None and list(manifest.methods) == ["fetch_url"]


def test_v1_artifact_is_migrated_with_health_and_no_cacheability(legacy_store: Path) -> None:
    lookup = ToolStore(legacy_store).lookup("web_fetcher", "fetch_url")
    art = lookup.artifact
    assert art is not None and lookup.file is not None
    assert art.schema_version == 2 and art.generation == 1 and lookup.file.next_generation == 2
    assert art.cacheable is None and art.cacheability_reason is None  # legacy: ADR 0013 section 4
    assert (art.success_count, art.intrinsic_failure_count, art.repair_count_since_regen) == (8, 2, 1)
    assert art.recent_failure_rate == pytest.approx(0.2)
    assert len(art.recent_outcomes) == 10 and art.recent_outcomes.count(False) == 2
    assert art.checksum_ok()


def test_legacy_rule_stable_reused_dynamic_not(legacy_store: Path) -> None:
    store = ToolStore(legacy_store)
    fetch = store.select("web_fetcher", "fetch_url", contract_fingerprint=None, runtime_version=RUNTIME)
    ask = store.select("assistant", "ask", contract_fingerprint=None, runtime_version=RUNTIME)
    assert fetch.decision is Decision.EXECUTE_PERSISTED
    assert ask.decision is Decision.REGENERATE


def test_migrated_records_are_written_back_on_next_write(legacy_store: Path) -> None:
    store = ToolStore(legacy_store)
    store.record_success("web_fetcher", "fetch_url")
    raw = json.loads(store.paths.method_file("web_fetcher", "fetch_url").read_text())
    assert raw["schema_version"] == 2 and raw["current"]["success_count"] == 9
    with sqlite3.connect(store.paths.registry) as db:  # the registry migrated into rows (once), then written
        (text,) = db.execute("SELECT entry FROM tools WHERE role = 'web_fetcher'").fetchone()
    assert json.loads(text)["schema_version"] == 2 and json.loads(text)["usage_count"] == 11
    assert not store.paths.legacy_registry.exists()
    kept = json.loads((store.paths.tools / "registry.json.migrated").read_text())  # the old file kept, as it was
    assert "schema_version" not in kept and kept["tools"]["web_fetcher"]["usage_count"] == 10


def test_new_generation_after_migration_keeps_the_legacy_one_in_history(legacy_store: Path) -> None:
    store = ToolStore(legacy_store)
    store.record_regeneration(candidate(fingerprint=WEB_FETCHER.fingerprint()))
    history = store.history("web_fetcher", "fetch_url")
    assert [a.generation for a in history] == [2, 1]
    assert history[1].code == LEGACY_FETCH


@pytest.mark.parametrize("which", ["registry", "manifest", "method", "patterns"])
def test_newer_schema_is_refused(state_dir: Path, which: str) -> None:
    store = ToolStore(state_dir)
    path = {
        "registry": store.paths.legacy_registry,
        "manifest": store.paths.manifest("web_fetcher"),
        "method": store.paths.method_file("web_fetcher", "fetch_url"),
        "patterns": store.paths.patterns,
    }[which]
    _write(path, {"schema_version": 99, "anything": "from the future"})
    with pytest.raises(SchemaTooNewError) as info:
        if which == "registry":
            store.list_tools()
        elif which == "manifest":
            store.manifest("web_fetcher")
        elif which == "method":
            store.lookup("web_fetcher", "fetch_url")
        else:
            store.patterns.events("x")
    assert info.value.found == 99 and "99" in str(info.value) and info.value.hint
    assert path.exists()  # refused, not quarantined: the newer data is left alone
    assert not list(path.parent.glob("*.corrupt-*"))


def test_newer_schema_blocks_writes_too(state_dir: Path) -> None:
    store = ToolStore(state_dir)
    _write(store.paths.method_file("web_fetcher", "fetch_url"), {"schema_version": 3})
    with pytest.raises(SchemaTooNewError):
        store.record_regeneration(candidate())
    assert json.loads(store.paths.method_file("web_fetcher", "fetch_url").read_text()) == {"schema_version": 3}


@pytest.mark.parametrize("version", ["2", -1, 0, True, None])
def test_bad_schema_version_is_corrupt(version: object) -> None:
    with pytest.raises(CorruptRecord):
        decode(REGISTRY, json.dumps({"schema_version": version, "tools": {}}).encode(), Path("r"))


def test_decode_current_fast_path_and_legacy_path() -> None:
    _, migrated = decode(REGISTRY, b'{"schema_version": 2, "tools": {}}', Path("r"))
    assert not migrated
    mf, migrated = decode(METHOD, json.dumps(_v1_artifact("r", "m", "return 1")).encode(), Path("m"))
    assert migrated and mf.current.method_name == "m"


def test_select_on_migrated_artifact_with_contract_mismatch_repairs(legacy_store: Path) -> None:
    art = ToolStore(legacy_store).lookup("web_fetcher", "fetch_url").artifact
    s = select_artifact(art, method_name="fetch_url", contract_fingerprint="f" * 64, runtime_version=RUNTIME)
    assert s.decision is Decision.REPAIR
