"""The pages agree with the calls that already returned, and a rewrite the stat cannot tell apart still shows.

The tools page and its JSON twin once differed under load: a persisted call's success is written behind by
the runtime's writer thread, and the two reads straddled that write. The board now settles the queued
writes before it reads.
"""

from __future__ import annotations

from pathlib import Path

from sandforge.runtime.agent.persistence import ToolStoreSource
from sandforge.runtime.dashboard.views import Board, artifact_page, tools_page
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.store import ArtifactCandidate, ToolStore, assess_cacheability
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
