"""The persisted tools board: a fresh process's first pages decode no registry when it is at the version the board
describes, read only the rows written since when it is at a later sequence of the same generation, and never
show a board that does not describe it (another process's write or delete, an edit by hand, a method file
changed by hand, a racing save, a damaged row)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.dashboard import toolhealth
from sandforge.runtime.dashboard.boardsnap import BoardSnapshot
from sandforge.runtime.dashboard.healthsnap import HealthSnapshot
from sandforge.runtime.dashboard.views import Board, artifact_page, overview_page, tools_page
from sandforge.runtime.guardrails import Policy, default_policy
from sandforge.runtime.store import FailureClass, ToolStore
from sandforge.sandbox import SandboxConfig
from tests.dashboard.seeded import ROLES, seeded_store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    seeded_store(tmp_path / "state")
    return tmp_path


class Process:
    """A fresh dashboard process: its own store and board, counting registry decodes and method-file reads."""

    def __init__(self, root: Path, policy: Callable[[], Policy] = default_policy) -> None:
        self.store = ToolStore(root / "state")
        self.registry_loads = 0
        self.reads: list[tuple[str, str]] = []
        self.deltas: list[int] = []  # entries read by changed_since, per call
        load, lookup, since = self.store._load_registry, self.store.lookup, self.store.changed_since

        def counted_load() -> Any:
            self.registry_loads += 1
            return load()

        def counted_lookup(role: str, method: str) -> Any:
            self.reads.append((role, method))
            return lookup(role, method)

        def counted_since(version: str) -> Any:
            found = since(version)
            self.deltas.append(-1 if found is None else len(found[1]))
            return found

        self.store._load_registry = counted_load  # type: ignore[method-assign]
        self.store.changed_since = counted_since  # type: ignore[method-assign]
        self.store.lookup = counted_lookup  # type: ignore[method-assign]
        self.board = Board(tenant="t", store=self.store, call_log=root / "state" / "logs" / "calls.jsonl",
                           policy=policy, sandbox=SandboxConfig(backend="subprocess"))  # fmt: skip

    def badges(self) -> dict[str, str]:
        return {t.role: t.badge for t in tools_page(self.board).tools}

    def counts(self) -> dict[str, int]:
        return overview_page(self.board).badge_counts


def _count_calls(obj: Any, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


@pytest.fixture
def fresh(root: Path) -> Iterator[Callable[..., Process]]:
    made: list[Process] = []

    def make(**kwargs: Any) -> Process:
        made.append(Process(root, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.board.close()


def test_a_fresh_process_decodes_no_registry_for_its_first_pages(fresh: Callable[..., Process]) -> None:
    first = fresh()
    counts, badges = first.counts(), first.badges()
    assert counts["healthy"] == 3 and first.registry_loads >= 1
    second = fresh()
    assert second.counts() == counts
    page = tools_page(second.board, sort="usage", descending=True)
    assert {t.role: t.badge for t in page.tools} == badges
    assert [t.purpose for t in page.tools] == [t.purpose for t in tools_page(first.board, sort="usage",
                                                                            descending=True).tools]  # fmt: skip
    assert second.reads == []  # no method file read for the lists
    art = artifact_page(second.board, "geo", "run")  # reads its own method file (the code), nothing else
    assert art is not None and art.health.badge == "healthy"
    assert second.registry_loads == 0  # the overview, every tool's row, the shown entries: all from the board


def test_a_write_by_another_process_is_never_taken_from_the_board(
    fresh: Callable[..., Process], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh().badges()
    monkeypatch.setattr(toolhealth, "file_stamp", lambda path: (1, 1, 1))  # stats that never change
    other = ToolStore(root / "state")
    for _ in range(3):
        other.record_failure("fmt", "run", FailureClass.INTRINSIC, "ValueError: boom")
    after = fresh()
    loads = _count_calls(after.board.boards, "load")
    assert after.counts()["degraded"] == 1
    assert loads == []  # the overview: the saved summary, updated with the row written since (no board rows read)
    assert after.registry_loads == 0 and after.deltas == [1]  # the one row written since, not the registry
    assert after.reads == [("fmt", "run")]  # and only its method file
    assert after.board.health._persisted is None  # and only its persisted health row, not every one
    assert after.badges()["fmt"] == "degraded"
    again = fresh()
    assert again.counts() == after.counts() and again.deltas == []  # the board saved at the new version
    other.record_success("calc", "run")
    assert after.board.tools() and after.deltas == [1, 1] and after.registry_loads == 0  # a warm one too


def test_a_delete_by_another_process_reads_the_whole_registry(fresh: Callable[..., Process], root: Path) -> None:
    first = fresh()
    assert set(first.badges()) == set(ROLES)
    other = ToolStore(root / "state")
    with sqlite3.connect(other.paths.registry) as db:  # geo idle for a year: the only one pruned
        db.execute("UPDATE tools SET entry = json_set(entry, '$.last_used_at', '2020-01-01T00:00:00Z') "
                   "WHERE role = 'geo'")  # fmt: skip
    assert [c.role for c in other.prune(older_than_days=30, apply=True).candidates] == ["geo"]
    after = fresh()
    assert set(after.badges()) == {"calc", "fmt"}
    assert after.registry_loads >= 1 and -1 in after.deltas  # another generation: no delta, the whole registry
    first.board._snapshot = None  # its kept rows expire: a warm process sees the delete too
    assert set(first.badges()) == {"calc", "fmt"}


def test_a_registry_row_edited_by_hand_is_seen(fresh: Callable[..., Process], root: Path) -> None:
    fresh().badges()
    registry = root / "state" / "tools" / "registry.sqlite"
    before = registry.stat()
    with sqlite3.connect(registry) as db:  # the entry only: its seq left as it was (a trigger moves it)
        db.execute("UPDATE tools SET entry = json_set(entry, '$.usage_count', 77) WHERE role = 'fmt'")
    assert (registry.stat().st_ino, registry.stat().st_size) == (before.st_ino, before.st_size)  # written to the WAL
    after = fresh()
    after.counts()
    assert after.deltas == [1]  # the edited row, as if the store had written it
    assert {t.role: t.usage_count for t in tools_page(after.board).tools}["fmt"] == 77


def test_a_method_file_changed_by_hand_amends_the_board(fresh: Callable[..., Process], root: Path) -> None:
    fresh().badges()
    path = ToolStore(root / "state").paths.method_file("geo", "run")
    path.write_text(path.read_text().replace('"success_count": 4', '"success_count": 0'))  # registry untouched
    shown = fresh()
    assert shown.counts()["unproven"] == 0  # not looked at yet: the board as it was
    assert shown.badges()["geo"] == "unproven"  # a row shown is checked against its method file
    assert shown.counts()["unproven"] == 1  # and the board amended
    assert fresh().counts()["unproven"] == 1  # the persisted one too


def test_a_save_racing_another_process_rewrites_the_whole_board(tmp_path: Path, root: Path) -> None:
    first = Process(root)
    rows = first.board.tools()
    assert len(rows) == 3
    boards = BoardSnapshot(HealthSnapshot(tmp_path / "race.sqlite", "ctx"))
    start = boards.load().generation
    mine = boards.save("A:1", start, rows, [(t, None) for t in rows], [])
    theirs = boards.save("B:1", mine, rows[:1], [(rows[0], None)], [rows[1].role, rows[2].role])
    assert [t.role for t in boards.load().rows] == [rows[0].role]
    # a process that read the board before "theirs" saves only its changed row: the rest is rewritten too
    late = boards.save("C:1", mine, rows, [(rows[2], None)], [])
    stored = boards.load()
    assert late == theirs + 1 and stored.registry == "C:1"
    assert [t.role for t in stored.rows] == [t.role for t in rows]
    first.board.close()


def test_a_damaged_board_is_never_used(fresh: Callable[..., Process], root: Path) -> None:
    counts = fresh().counts()
    with sqlite3.connect(root / "state" / "logs" / "dashboard-health.sqlite") as db:
        db.execute("UPDATE board SET badge = 'splendid' WHERE role = 'geo'")
        db.execute("UPDATE meta SET value = '[1' WHERE key = 'board_summary'")
    damaged = fresh()
    assert damaged.counts() == counts
    assert damaged.badges() == {r: "healthy" for r in ROLES}
    assert damaged.registry_loads >= 1


def test_the_first_pages_do_not_build_the_tenants_policy(fresh: Callable[..., Process]) -> None:
    fresh().badges()
    built: list[int] = []

    def policy() -> Policy:
        built.append(1)
        return default_policy()

    p = fresh(policy=policy)
    p.counts()
    p.badges()
    assert built == []
    art = artifact_page(p.board, "calc", "run")
    assert art is not None and art.verdict and built == [1]
