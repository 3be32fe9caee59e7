"""registry.sqlite: one row per tool, read and written per entry; migrated from registry.json once; a damaged
file or row rebuilt from the role directories; never followed through a link; a newer schema refused."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sandforge.runtime.store import SchemaTooNewError, ToolStore
from sandforge.runtime.store import registry_db as regdb
from sandforge.runtime.store.models import RegistryFile
from tests.store.conftest import candidate

ROLES = ("alpha", "beta", "gamma")


def _fill(state: Path) -> ToolStore:
    store = ToolStore(state)
    for role in ROLES:
        store.record_regeneration(candidate(role=role, method="run", fingerprint=None))
        store.record_success(role, "run", count=2)
    return store


@pytest.fixture
def filled(state_dir: Path) -> ToolStore:
    return _fill(state_dir)


def _rows(store: ToolStore) -> dict[str, tuple[int, dict[str, Any]]]:
    with sqlite3.connect(store.paths.registry) as db:
        return {r: (seq, json.loads(e)) for r, seq, e in db.execute("SELECT role, seq, entry FROM tools")}


def _meta(store: ToolStore) -> dict[str, str]:
    with sqlite3.connect(store.paths.registry) as db:
        return dict(db.execute("SELECT key, value FROM meta"))


def _corrupt(store: ToolStore) -> list[str]:
    names = [p.name for p in store.tools_dir.iterdir() if p.name.startswith("registry.sqlite.corrupt-")]
    return sorted(n for n in names if not n.endswith(("-wal", "-shm")))  # side files moved with it


# --- per entry ---------------------------------------------------------------------------------------------


def test_a_write_touches_one_row_and_moves_the_sequence(filled: ToolStore) -> None:
    before, meta = _rows(filled), _meta(filled)
    filled.record_success("beta", "run")
    after = _rows(filled)
    assert int(_meta(filled)["seq"]) == int(meta["seq"]) + 1 == after["beta"][0]
    assert after["beta"][1]["usage_count"] == before["beta"][1]["usage_count"] + 1
    assert {r: v for r, v in after.items() if r != "beta"} == {r: v for r, v in before.items() if r != "beta"}
    assert _meta(filled)["generation"] == meta["generation"]  # a write is no delete
    with sqlite3.connect(filled.paths.registry) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_reader_reads_only_the_rows_written_since(
    filled: ToolStore, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, writer = ToolStore(state_dir), ToolStore(state_dir)
    assert len(reader.list_tools()) == 3 == len(writer.list_tools())
    patched: list[int] = []
    real = regdb.RegistryDB._patched

    def spy(held: regdb.Snapshot, version: regdb.Version, rows: list[tuple[str, str]]) -> regdb.Snapshot:
        patched.append(len(rows))
        return real(held, version, rows)

    def no_whole(*_: object) -> None:
        raise AssertionError("the whole registry was read")

    monkeypatch.setattr(regdb.RegistryDB, "_patched", staticmethod(spy))
    monkeypatch.setattr(regdb.RegistryDB, "_whole", no_whole)
    used = writer.get_tool("gamma").usage_count  # type: ignore[union-attr]
    writer.record_success("gamma", "run", count=5)
    entry = reader.get_tool("gamma")
    assert entry is not None and entry.usage_count == used + 5 and patched == [1]
    assert reader.list_tools() is not None and patched == [1]  # nothing new: nothing read


def test_changed_since_names_only_the_new_entries_and_refuses_across_a_delete(
    filled: ToolStore, state_dir: Path, clock: Any
) -> None:
    version = filled.registry_version()
    assert version is not None
    other = ToolStore(state_dir, clock=clock)
    other.record_failure("alpha", "run", "intrinsic", "boom")
    found = filled.changed_since(version)
    assert found is not None and [e.role for e in found[1]] == ["alpha"] and found[0] == other.registry_version()
    assert filled.changed_since("no-such-generation:0") is None and filled.changed_since("garbage") is None
    clock.advance(days=400)
    other.record_success("beta", "run")
    other.prune(older_than_days=100, apply=True)  # alpha and gamma: idle for 400 days
    assert filled.changed_since(found[0]) is None  # another generation: read everything
    assert [t.role for t in filled.list_tools()] == ["beta"]


def test_a_row_edited_by_hand_gets_a_new_sequence(filled: ToolStore, state_dir: Path) -> None:
    reader = ToolStore(state_dir)
    reader.list_tools()
    version = reader.registry_version()
    with sqlite3.connect(filled.paths.registry) as db:
        db.execute("UPDATE tools SET entry = json_set(entry, '$.usage_count', 99) WHERE role = 'alpha'")
    assert reader.registry_version() != version
    entry = reader.get_tool("alpha")
    assert entry is not None and entry.usage_count == 99


# --- damage ------------------------------------------------------------------------------------------------


def _truncated(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "truncated", "bad schema", "no meta", "other database", "fifo", "symlink", "wal symlink"],
)
def test_a_damaged_registry_is_moved_aside_and_rebuilt(
    filled: ToolStore, state_dir: Path, tmp_path: Path, damage: str
) -> None:
    path = filled.paths.registry
    outside = tmp_path / "outside.db"
    outside.write_bytes(b"not yours")
    if damage == "truncated":
        _truncated(path)
    elif damage in ("bad schema", "no meta"):
        with sqlite3.connect(path) as db:
            db.execute(
                "UPDATE meta SET value = 'x' WHERE key = 'schema'" if damage == "bad schema" else "DROP TABLE meta"
            )
    elif damage == "wal symlink":
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        Path(f"{path}-wal").unlink(missing_ok=True)
        Path(f"{path}-wal").symlink_to(outside)
    else:
        for side in ("-wal", "-shm"):
            Path(f"{path}{side}").unlink(missing_ok=True)
        path.unlink()
        if damage == "garbage":
            path.write_bytes(b"\x00\xffgarbage" * 100)
        elif damage == "empty":
            path.write_bytes(b"")
        elif damage == "other database":
            with sqlite3.connect(path) as db:
                db.execute("CREATE TABLE tools (x)")
        elif damage == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(outside)
    fresh = ToolStore(state_dir)
    assert [t.role for t in fresh.list_tools()] == list(ROLES)  # rebuilt from the role directories
    entry = fresh.get_tool("beta")
    assert entry is not None and entry.success_count == 3 and entry.methods == ["run"]
    assert len(_corrupt(fresh)) == 1 and path.is_file() and not path.is_symlink()
    assert outside.read_bytes() == b"not yours"  # a link is moved aside, never followed
    fresh.record_success("beta", "run")  # and written again
    assert ToolStore(state_dir).get_tool("beta").success_count == 4  # type: ignore[union-attr]


def test_a_newer_schema_is_refused_not_rebuilt(filled: ToolStore, state_dir: Path) -> None:
    with sqlite3.connect(filled.paths.registry) as db:
        db.execute("UPDATE meta SET value = '9' WHERE key = 'schema'")
    fresh = ToolStore(state_dir)
    with pytest.raises(SchemaTooNewError, match="schema_version 9"):
        fresh.list_tools()
    with pytest.raises(SchemaTooNewError):
        fresh.record_success("alpha", "run")
    assert not _corrupt(fresh) and _meta(fresh)["schema"] == "9"


@pytest.mark.parametrize("row", ["not json", "another role", "wrong shape", "unknown role"])
def test_a_damaged_row_is_rebuilt_alone(filled: ToolStore, state_dir: Path, row: str) -> None:
    filled.record_success("gamma", "run", count=10)  # counters the rebuild from files would not find exactly
    good = _rows(filled)["gamma"][1]
    beta = _rows(filled)["beta"][1]
    text = {"not json": '{"role": "beta", "usa', "another role": json.dumps({**beta, "role": "alpha"}),
            "wrong shape": '{"role": "beta", "usage_count": -4}', "unknown role": "{}"}[row]  # fmt: skip
    target = "ghost" if row == "unknown role" else "beta"
    with sqlite3.connect(filled.paths.registry) as db:
        db.execute("INSERT OR REPLACE INTO tools VALUES (?, 1000, ?)", (target, text))
    fresh = ToolStore(state_dir)
    roles = [t.role for t in fresh.list_tools()]
    assert roles == list(ROLES)  # the ghost row dropped (no directory of its own), beta rebuilt
    assert (
        fresh.get_tool("gamma")
        == RegistryFile.model_validate({"schema_version": 2, "tools": {"gamma": good}}).tools["gamma"]
    )  # the other rows exactly as they were
    rebuilt = fresh.get_tool("beta")
    assert rebuilt is not None and rebuilt.role == "beta" and rebuilt.methods == ["run"]
    with sqlite3.connect(fresh.paths.registry) as db:
        assert db.execute("SELECT role, entry FROM damaged").fetchall() == [(target, text)]  # kept for a look
    assert not _corrupt(fresh)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(cut=1.0, flips=[(0.1328125, 128)])  # a header byte that made a pragma's answer invalid UTF-8
@given(cut=st.floats(0.0, 1.0), flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), max_size=8))
def test_any_damage_to_the_file_is_survived(tmp_path_factory: pytest.TempPathFactory, cut: float, flips: Any) -> None:
    store = _fill(tmp_path_factory.mktemp("fuzz") / "state")
    path = store.paths.registry
    store._db.close()  # at rest: the last connection closed checkpoints the WAL into the file
    data = bytearray(path.read_bytes())
    for where, xor in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= xor
    path.write_bytes(bytes(data[: max(1, int(cut * len(data)))] if cut < 1.0 else data))
    fresh = ToolStore(store.paths.state_dir)
    assert set(t.role for t in fresh.list_tools()) <= set(ROLES)
    fresh.record_success("alpha", "run")
    entry = ToolStore(store.paths.state_dir).get_tool("alpha")
    assert entry is not None and entry.role == "alpha"


# --- migration ---------------------------------------------------------------------------------------------


def _legacy(store: ToolStore) -> dict[str, Any]:
    """registry.json as the store wrote it before the rows (the same entries)."""
    tools = {t.role: json.loads(t.model_dump_json()) for t in store.list_tools()}
    return {"schema_version": 2, "tools": tools}


def _unmigrate(store: ToolStore, legacy: dict[str, Any] | bytes) -> None:
    for side in ("", "-wal", "-shm"):
        Path(f"{store.paths.registry}{side}").unlink(missing_ok=True)
    raw = legacy if isinstance(legacy, bytes) else json.dumps(legacy).encode()
    store.paths.legacy_registry.write_bytes(raw)


def test_registry_json_is_migrated_once_and_kept(filled: ToolStore, state_dir: Path) -> None:
    filled.record_success("alpha", "run", count=7)
    legacy = _legacy(filled)
    _unmigrate(filled, legacy)
    fresh = ToolStore(state_dir)
    assert {t.role: json.loads(t.model_dump_json()) for t in fresh.list_tools()} == legacy["tools"]  # exactly
    assert not filled.paths.legacy_registry.exists()
    kept = filled.tools_dir / "registry.json.migrated"
    assert json.loads(kept.read_text()) == legacy
    fresh.record_success("alpha", "run")
    filled.paths.legacy_registry.write_text(json.dumps(legacy))  # an old file back: ignored, not migrated again
    assert ToolStore(state_dir).get_tool("alpha").usage_count == legacy["tools"]["alpha"]["usage_count"] + 1  # type: ignore[union-attr]


def test_a_corrupt_registry_json_is_quarantined_and_the_registry_rebuilt(filled: ToolStore, state_dir: Path) -> None:
    _unmigrate(filled, b'{"schema_version": 2, "tools": {"alpha": ')
    fresh = ToolStore(state_dir)
    assert [t.role for t in fresh.list_tools()] == list(ROLES)
    assert [p for p in fresh.tools_dir.iterdir() if p.name.startswith("registry.json.corrupt-")]
    assert fresh.paths.registry.is_file()


def test_a_newer_registry_json_is_refused_not_migrated(filled: ToolStore, state_dir: Path) -> None:
    _unmigrate(filled, {"schema_version": 3, "tools": {}})
    with pytest.raises(SchemaTooNewError):
        ToolStore(state_dir).list_tools()
    assert filled.paths.legacy_registry.exists() and not filled.paths.registry.exists()


def test_an_empty_store_creates_nothing_until_a_write(state_dir: Path) -> None:
    store = ToolStore(state_dir)
    assert store.list_tools() == [] and store.registry_version() is None and not state_dir.exists()
