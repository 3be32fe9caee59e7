"""The pages agree with the calls that already returned, and a rewrite the stat cannot tell apart still shows.

The tools page and its JSON twin once differed under load: a persisted call's success is written behind by
the runtime's writer thread, and the two reads straddled that write. The board now settles the queued
writes before it reads. Its caches were keyed by stat alone, which a rewrite can leave unchanged (inode
reused after an atomic rename, same mtime tick, same size): a recently written file is now read again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent.persistence import ToolStoreSource
from sandforge.runtime.dashboard.toolhealth import HealthCache
from sandforge.runtime.dashboard.views import Board, artifact_page, tools_page
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.store import ArtifactCandidate, FailureClass, ToolStore, assess_cacheability
from sandforge.sandbox import SandboxConfig

CODE = "return args[0] * 2\n"


def _store_with_a_tool(tmp_path: Path) -> ToolStore:
    store = ToolStore(tmp_path / "state")
    store.record_regeneration(ArtifactCandidate(
        role="calc", method_name="double", code=CODE, runtime_version="0.1.0", prompt_version=None,
        cacheability=assess_cacheability("double", CODE, [2], {}, is_delegated_contract=False),
    ))  # fmt: skip
    return store


def _board(store: ToolStore, tmp_path: Path) -> Board:
    return Board(tenant="t", store=store, call_log=tmp_path / "calls.jsonl", policy=default_policy(),
                 sandbox=SandboxConfig(backend="subprocess"))  # fmt: skip


def test_a_success_still_queued_by_the_write_behind_shows_on_every_page(tmp_path: Path) -> None:
    store = _store_with_a_tool(tmp_path)
    source = ToolStoreSource(store, write_behind_delay=3600.0)  # its writer thread would wait an hour
    board = _board(store, tmp_path)
    try:
        before = tools_page(board).tools[0]
        n, m = before.success_count, before.methods[0].success_count
        source._defer_success("calc", "double", 1)  # what a persisted call's success does (persistence.py)
        source._defer_success("calc", "double", 1)
        row = tools_page(board).tools[0]
        assert (row.success_count, row.methods[0].success_count) == (n + 2, m + 2)
        assert not source._pending
        source._defer_success("calc", "double", 1)
        page = artifact_page(board, "calc", "double")
        assert page is not None and page.health.success_count == m + 3
    finally:
        source.close()
        board.close()


def _frozen_lstat(monkeypatch: pytest.MonkeyPatch, paths: list[Path]) -> None:
    """From now on ``paths`` stat as they do now: the next write reuses the inode freed by the last atomic
    rename, lands in the same mtime tick and keeps the size (what a loaded machine does now and then)."""
    real = os.lstat
    frozen = {str(p): real(p) for p in paths}

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return frozen.get(os.fspath(path)) or real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)


def test_a_rewrite_that_keeps_inode_mtime_and_size_still_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store_with_a_tool(tmp_path)
    board = _board(store, tmp_path)
    before = tools_page(board).tools[0]
    _frozen_lstat(monkeypatch, [store.paths.registry, store.paths.method_file("calc", "double")])
    store.record_failure("calc", "double", FailureClass.INTRINSIC, "ValueError: boom", generation=1)
    row = tools_page(board).tools[0]
    assert (row.failure_count, row.methods[0].failure_count) == (
        before.failure_count + 1,
        before.methods[0].failure_count + 1,
    )
    page = artifact_page(board, "calc", "double")
    assert page is not None and page.health.failure_count == before.methods[0].failure_count + 1
    board.close()


def test_a_file_older_than_the_racy_window_is_trusted_by_its_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store_with_a_tool(tmp_path)
    path = store.paths.method_file("calc", "double")
    hour_ago = time.time() - 3600
    os.utime(path, (hour_ago, hour_ago))
    reads: list[str] = []
    lookup = store.lookup
    monkeypatch.setattr(store, "lookup", lambda role, method: reads.append(method) or lookup(role, method))
    cache = HealthCache(store)
    entry = store.get_tool("calc")
    assert entry is not None
    first = cache.method(entry, "double")
    assert cache.method(entry, "double") == first and reads == ["double"]  # the second look: one stat, no read
    os.utime(path)  # touched now: within the racy window, read on every look
    cache.method(entry, "double")
    cache.method(entry, "double")
    assert reads == ["double"] * 3
