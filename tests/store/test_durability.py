"""Atomic writes and quarantine of corrupt or unreadable files (the run goes on)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.store import Decision, LookupStatus, SelectionReason, StoreIOError, ToolStore, record_files
from tests.store.conftest import RUNTIME, WEB_FETCHER, candidate

FP = WEB_FETCHER.fingerprint()


def _corrupt_files(directory: Path, name: str) -> list[Path]:
    return sorted(directory.glob(f"{name}.corrupt-*"))


@pytest.fixture
def filled(store: ToolStore) -> ToolStore:
    store.register_tool(WEB_FETCHER)
    store.record_regeneration(candidate())
    store.record_success("web_fetcher", "fetch_url")
    store.record_pattern("assistant", "ask", ["rss_parse"])
    return store


# --- atomicity ---------------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_intact(filled: ToolStore, monkeypatch: pytest.MonkeyPatch) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    before = path.read_bytes()

    def broken_replace(src: object, dst: object, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(StoreIOError, match="No space left"):
        filled.record_success("web_fetcher", "fetch_url")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # temp file cleaned up
    art = filled.lookup("web_fetcher", "fetch_url").artifact
    assert art is not None and art.success_count == 2


def test_writes_go_through_fsync_and_rename(filled: ToolStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(src: str, dst: str, **kwargs: int) -> None:
        calls.append("replace")
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    filled.record_success("web_fetcher", "fetch_url")
    assert calls.count("replace") >= 1  # the method file (the registry row: a SQLite transaction, synchronous=FULL)
    assert calls.index("fsync") < calls.index("replace")


def test_no_stray_files_after_writes(filled: ToolStore) -> None:
    names = {p.name for p in filled.tools_dir.rglob("*")}
    assert not [n for n in names if n.endswith(".tmp") or ".corrupt-" in n]


# --- quarantine --------------------------------------------------------------------------------------------


def test_corrupt_artifact_is_quarantined_and_selection_generates(
    filled: ToolStore, caplog: pytest.LogCaptureFixture
) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    path.write_text('{"schema_version": 2, "role": "web_fe')
    with caplog.at_level(logging.WARNING):
        s = filled.select("web_fetcher", "fetch_url", contract_fingerprint=FP, runtime_version=RUNTIME)
    assert (s.decision, s.reason) == (Decision.GENERATE, SelectionReason.CORRUPT)
    assert not path.exists()
    quarantined = _corrupt_files(path.parent, path.name)
    assert len(quarantined) == 1 and quarantined[0].read_text().startswith('{"schema_version"')
    assert "quarantined" in caplog.text
    # the run goes on: a new generation is stored in its place
    art = filled.record_regeneration(candidate())
    assert art.generation == 1
    assert filled.lookup("web_fetcher", "fetch_url").status is LookupStatus.FOUND


def test_valid_json_with_wrong_shape_is_corrupt(filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    path.write_text(json.dumps({"schema_version": 2, "current": "nope"}))
    assert filled.lookup("web_fetcher", "fetch_url").status is LookupStatus.CORRUPT
    assert _corrupt_files(path.parent, path.name)


def test_artifact_of_another_identity_is_quarantined(filled: ToolStore) -> None:
    src = filled.paths.method_file("web_fetcher", "fetch_url")
    dst = filled.paths.method_file("web_fetcher", "other")
    dst.write_bytes(src.read_bytes())  # a file copied by hand under the wrong name
    lookup = filled.lookup("web_fetcher", "other")
    assert lookup.status is LookupStatus.CORRUPT and "expected" in lookup.reason


def test_unreadable_file_is_quarantined(filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    path.unlink()
    path.mkdir()  # a directory where the file should be: reading fails with EISDIR
    lookup = filled.lookup("web_fetcher", "fetch_url")
    assert lookup.status is LookupStatus.CORRUPT and "unreadable" in lookup.reason
    assert not path.exists() and _corrupt_files(path.parent, path.name)


def test_corrupt_registry_is_quarantined_and_rebuilt(filled: ToolStore, clock: object) -> None:
    filled.paths.registry.write_bytes(b"\x00\xffgarbage")
    fresh = ToolStore(filled.paths.state_dir)
    entry = fresh.get_tool("web_fetcher")
    assert entry is not None
    assert entry.purpose == WEB_FETCHER.purpose  # contract recovered from the manifest
    assert entry.methods == ["fetch_url"] and entry.success_count == 2
    assert entry.capabilities == ["http_fetch"]
    assert _corrupt_files(filled.tools_dir, "registry.sqlite")
    with sqlite3.connect(filled.paths.registry) as db:  # rewritten: a registry again
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("1",)
        assert [r for (r,) in db.execute("SELECT role FROM tools")] == ["web_fetcher"]


def test_deleted_registry_is_rebuilt_from_role_directories(filled: ToolStore) -> None:
    filled.paths.registry.unlink()
    assert [t.role for t in ToolStore(filled.paths.state_dir).list_tools()] == ["web_fetcher"]


def test_corrupt_manifest_is_quarantined_and_rebuilt_on_next_write(filled: ToolStore) -> None:
    manifest = filled.paths.manifest("web_fetcher")
    manifest.write_text("[]")
    assert filled.manifest("web_fetcher") is None
    assert _corrupt_files(manifest.parent, "manifest.json")
    filled.record_regeneration(candidate(method="fetch_json"))
    rebuilt = filled.manifest("web_fetcher")
    assert rebuilt is not None and sorted(rebuilt.methods) == ["fetch_json", "fetch_url"]
    assert rebuilt.contract is not None and rebuilt.contract.purpose == WEB_FETCHER.purpose


def test_corrupt_pattern_memory_is_quarantined_and_starts_empty(filled: ToolStore) -> None:
    filled.paths.patterns.write_text('{"schema_version": 1, "roles": {"assistant": {"events": [{"timest')
    assert filled.patterns.events("assistant") == []
    assert _corrupt_files(filled.tools_dir, "patterns.json")
    filled.record_pattern("assistant", "ask", ["http_fetch"])
    assert [e.capability_patterns for e in filled.patterns.events("assistant")] == [["http_fetch"]]


def test_quarantine_names_do_not_collide(filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    for _ in range(3):  # same frozen clock each time
        path.write_text("not json")
        filled.lookup("web_fetcher", "fetch_url")
    assert len(_corrupt_files(path.parent, path.name)) == 3


def test_a_good_file_is_never_quarantined_by_a_reader_that_saw_it_half_way(
    filled: ToolStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader re-reads under the lock before quarantining: if a writer fixed the file, it is kept."""
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    good = path.read_bytes()
    real_read = record_files.read_state_file
    calls = {"n": 0}

    def flaky_read(base: Path, self: Path, **kwargs: Any) -> bytes:
        if self == path:
            calls["n"] += 1
            if calls["n"] == 1:
                return good[:20]  # what a torn, non-atomic write would look like
        return real_read(base, self, **kwargs)

    monkeypatch.setattr(record_files, "read_state_file", flaky_read)
    lookup = filled.lookup("web_fetcher", "fetch_url")
    assert lookup.status is LookupStatus.FOUND
    assert path.exists() and not _corrupt_files(path.parent, path.name)
    assert calls["n"] == 2
    assert path.read_bytes() == good
