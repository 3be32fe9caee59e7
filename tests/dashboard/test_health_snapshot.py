"""The persisted health snapshot: a fresh process's first tools page reads no method file the snapshot holds,
and no write (this process's, another's, by hand) ever leaves a stale row shown as fresh."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.dashboard import toolhealth
from sandforge.runtime.dashboard.views import Board, overview_page, tools_page
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.store import FailureClass, ToolStore
from sandforge.runtime.store.selection import SelectionPolicy
from sandforge.sandbox import SandboxConfig
from tests.dashboard.seeded import ROLES, seeded_store


@pytest.fixture
def state(tmp_path: Path) -> Path:
    seeded_store(tmp_path / "state")
    return tmp_path


class Process:
    """A fresh dashboard process: its own store object and board, counting method-file reads."""

    def __init__(self, root: Path, policy: SelectionPolicy | None = None) -> None:
        self.store = ToolStore(root / "state", **({"policy": policy} if policy else {}))
        self.reads: list[tuple[str, str]] = []
        lookup = self.store.lookup

        def counted(role: str, method: str) -> Any:
            self.reads.append((role, method))
            return lookup(role, method)

        self.store.lookup = counted  # type: ignore[method-assign]
        self.board = Board(tenant="t", store=self.store, call_log=root / "state" / "logs" / "calls.jsonl",
                           policy=default_policy(), sandbox=SandboxConfig(backend="subprocess"))  # fmt: skip

    def badges(self) -> dict[str, str]:
        return {t.role: t.badge for t in tools_page(self.board).tools}

    def counts(self) -> dict[str, int]:
        return {t.role: t.methods[0].failure_count for t in tools_page(self.board).tools}

    def first_overview(self) -> dict[str, int]:
        return overview_page(self.board).badge_counts


@pytest.fixture
def processes(state: Path) -> Iterator[list[Process]]:
    made: list[Process] = []
    yield made
    for p in made:
        p.board.close()


def _fresh(processes: list[Process], root: Path, **kwargs: Any) -> Process:
    p = Process(root, **kwargs)
    processes.append(p)
    return p


def test_a_fresh_process_reads_no_method_file_the_snapshot_holds(state: Path, processes: list[Process]) -> None:
    first = _fresh(processes, state)
    assert first.first_overview()["healthy"] == 3
    assert sorted(first.reads) == [(r, "run") for r in sorted(ROLES)]  # computed once, then persisted
    assert (state / "state" / "logs" / "dashboard-health.sqlite").stat().st_mode & 0o777 == 0o600
    second = _fresh(processes, state)
    assert second.first_overview() == first.first_overview()
    assert second.reads == []  # the overview and the counts came from the snapshot
    assert second.badges() == first.badges()


def test_a_write_by_another_process_is_never_shown_stale(
    state: Path, processes: list[Process], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the worst case for the stamp: every rewrite keeps inode, mtime and size; the registry entry still differs
    monkeypatch.setattr(toolhealth, "file_stamp", lambda path: (1, 1, 1))
    before = _fresh(processes, state).counts()
    other = ToolStore(state / "state")  # another process's store writes
    for _ in range(3):
        other.record_failure("fmt", "run", FailureClass.INTRINSIC, "ValueError: boom")
    fresh = _fresh(processes, state)
    assert fresh.counts() == before | {"fmt": before["fmt"] + 3}
    assert fresh.badges()["fmt"] == "degraded"
    assert [r for r, _ in fresh.reads] == ["fmt"] * len(fresh.reads)  # only the changed tool was read


def test_a_method_file_changed_by_hand_is_read_again(state: Path, processes: list[Process]) -> None:
    _fresh(processes, state).badges()
    store = ToolStore(state / "state")
    path = store.paths.method_file("geo", "run")
    text = path.read_text()
    assert '"success_count": 4' in text
    path.write_text(text.replace('"success_count": 4', '"success_count": 0'))  # the registry untouched
    fresh = _fresh(processes, state)
    assert fresh.badges()["geo"] == "unproven"
    assert ("geo", "run") in fresh.reads


def test_another_selection_policy_or_a_corrupt_file_drops_every_row(state: Path, processes: list[Process]) -> None:
    _fresh(processes, state).badges()
    strict = SelectionPolicy(degraded_failure_rate=0.0)
    moved = _fresh(processes, state, policy=strict)
    moved.badges()
    assert len(moved.reads) == 3
    snapshot = state / "state" / "logs" / "dashboard-health.sqlite"
    for suffix in ("-wal", "-shm"):
        Path(f"{snapshot}{suffix}").unlink(missing_ok=True)
    snapshot.write_bytes(b"not a database" * 100)
    broken = _fresh(processes, state)
    assert broken.badges() == {r: "healthy" for r in ROLES}
    assert len(broken.reads) == 3
    again = _fresh(processes, state)
    assert again.badges() == broken.badges() and again.reads == []  # a new snapshot replaced it


def test_the_snapshot_context_is_the_same_text_in_every_process() -> None:
    """The policy's sets (``dynamic_methods``) serialise in the hash seed's order: a context built from them
    as they come would drop every row in each new process."""
    script = (
        "from sandforge.runtime.dashboard.healthsnap import policy_text\n"
        "from sandforge.runtime.store.selection import SelectionPolicy\n"
        "print(policy_text(SelectionPolicy()))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    texts = set()
    for seed in range(6):
        env["PYTHONHASHSEED"] = str(seed)
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root, env=env
        )
        texts.add(run.stdout)
    assert len(texts) == 1


def test_a_tool_no_longer_in_the_registry_leaves_the_snapshot(state: Path, processes: list[Process]) -> None:
    import sqlite3

    _fresh(processes, state).badges()
    store = ToolStore(state / "state")
    plan = store.prune(older_than_days=0, apply=True)  # every tool unused since now: archived
    assert plan.candidates
    snapshot = state / "state" / "logs" / "dashboard-health.sqlite"
    _fresh(processes, state).badges()
    with sqlite3.connect(snapshot) as db:
        assert db.execute("SELECT COUNT(*) FROM health").fetchone()[0] == 3 - len(plan.candidates)
