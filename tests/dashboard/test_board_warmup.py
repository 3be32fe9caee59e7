"""The first full health build (a store whose board was never built) runs in the background: the first Overview
and Tools pages return without it, say so (page and JSON twin), and show the full figures once it is done; two
concurrent first pages start one build; a failed build is logged and the next page retries."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.dashboard import render, views
from sandforge.runtime.dashboard.views import Board, HealthBuilding, overview_page, patterns_page, tools_page
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.store import ArtifactCandidate, ToolStore, assess_cacheability
from sandforge.sandbox import SandboxConfig
from tests.dashboard.seeded import ROLES, seeded_store

WAIT = 10.0  # the longest a test waits for a background build it has let go


class Gated:
    """A fresh dashboard process whose method-file reads (``ToolStore.lookup``) block until released: the
    build they are part of is as slow as the test wants."""

    def __init__(self, root: Path) -> None:
        self.store = ToolStore(root / "state")
        self.gate = threading.Event()
        self.reads: list[tuple[str, str]] = []
        self.fail = 0  # reads that raise, the first ones
        self._lock = threading.Lock()
        lookup = self.store.lookup

        def slow(role: str, method: str) -> Any:
            with self._lock:
                self.reads.append((role, method))
                failing = self.fail > 0
                self.fail -= failing
            if failing:
                raise OSError("the disk said no")
            if len(self.reads) > 1:  # the first read passes: the progress shows one tool done
                assert self.gate.wait(WAIT)
            return lookup(role, method)

        self.store.lookup = slow  # type: ignore[method-assign]
        self.board = Board(tenant="t", store=self.store, call_log=root / "state" / "logs" / "calls.jsonl",
                           policy=default_policy(), sandbox=SandboxConfig(backend="subprocess"))  # fmt: skip

    def finish(self) -> None:
        self.gate.set()
        build = self.board._build
        assert build is not None and build.finished.wait(WAIT)


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gated]:
    monkeypatch.setattr(views, "INLINE_TOOLS", 0)  # three tools: a small board would be waited for whole
    seeded_store(tmp_path / "state")
    g = Gated(tmp_path)
    yield g
    g.gate.set()
    g.board.close()


def test_the_first_overview_does_not_wait_for_the_build(gated: Gated) -> None:
    first = overview_page(gated.board)
    assert first.health_building is not None and first.health_building.total == len(ROLES)  # counted, not read
    deadline = time.monotonic() + WAIT
    while first.health_building != HealthBuilding(done=1, total=len(ROLES)) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the first read passed and the second is held: the progress moves
        first = overview_page(gated.board)
    assert first.health_building == HealthBuilding(done=1, total=len(ROLES))
    assert first.tools == len(ROLES)  # known: the registry was read
    assert first.artifacts is None and first.flagged_total is None  # unknown, not zero
    assert first.badge_counts == {} and first.flagged == []
    twin = first.model_dump(mode="json")
    assert twin["health_building"] == {"done": 1, "total": len(ROLES)}
    html = render.page("overview.html", d=twin)
    assert 'id="health-building"' in html and "computing tool health: 1 of 3 tools" in html
    assert "Every artifact is healthy" not in html  # nothing claimed about health meanwhile
    gated.finish()
    done = overview_page(gated.board)
    assert done.health_building is None
    assert done.tools == len(ROLES) and done.artifacts == len(ROLES)
    assert done.badge_counts["healthy"] == len(ROLES)
    assert done.model_dump(mode="json")["health_building"] is None
    assert 'id="health-building"' not in render.page("overview.html", d=done.model_dump(mode="json"))


def test_the_first_tools_page_lists_nothing_until_the_health_is_known(gated: Gated) -> None:
    first = tools_page(gated.board, sort="usage", descending=True)
    assert first.health_building is not None and first.health_building.total == len(ROLES)
    assert first.tools == [] and first.badge_counts == {} and first.total == len(ROLES)
    html = render.page("tools.html", d=first.model_dump(mode="json"))
    assert "computing tool health" in html and "No tool matches" not in html
    gated.finish()
    done = tools_page(gated.board, sort="usage", descending=True)
    assert done.health_building is None
    assert sorted(t.role for t in done.tools) == sorted(ROLES)
    assert {t.badge for t in done.tools} == {"healthy"}
    assert sorted(set(gated.reads)) == [(r, "run") for r in sorted(ROLES)]  # the build read each once


def test_a_blocking_reader_waits_for_the_background_build(gated: Gated) -> None:
    assert overview_page(gated.board).health_building is not None
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(len(gated.board.tools())))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive()  # every row with its health: it waits
    gated.finish()
    reader.join(WAIT)
    assert got == [len(ROLES)]
    assert len(gated.reads) == len(ROLES)  # it did not build again


def test_two_concurrent_first_pages_start_one_build(gated: Gated, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[object] = []
    made = views._Build

    def counted() -> Any:
        builds.append(made())
        return builds[-1]

    monkeypatch.setattr(views, "_Build", counted)
    start = threading.Barrier(2)
    pages: list[Any] = []

    def first_page(build: Any) -> None:
        start.wait()
        pages.append(build(gated.board))

    threads = [threading.Thread(target=first_page, args=(f,)) for f in (overview_page, tools_page)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(pages) == 2 and all(p.health_building is not None for p in pages)
    assert len(builds) == 1
    gated.finish()
    assert overview_page(gated.board).health_building is None
    assert len(builds) == 1 and len(gated.reads) == len(ROLES)


def test_a_failed_build_is_logged_and_the_next_page_retries(
    gated: Gated, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "INLINE_TOOLS", 500)  # a small board: the page waits for the failed build's end
    gated.fail = 1
    gated.gate.set()
    with caplog.at_level(logging.ERROR):
        page = overview_page(gated.board)
    assert "computing the tools' health for tenant t failed" in caplog.text
    assert page.health_building is not None  # the page started the retry; nothing of the failed build shown
    retry = gated.board._build
    assert retry is not None and retry.finished.wait(WAIT) and retry.error is None
    assert overview_page(gated.board).badge_counts["healthy"] == len(ROLES)


def test_a_failed_build_fails_a_blocking_reader(gated: Gated) -> None:
    gated.fail = 100
    with pytest.raises(RuntimeError, match="computing the tools' health failed"):
        gated.board.tools()
    gated.fail = 0
    gated.gate.set()
    assert len(gated.board.tools()) == len(ROLES)  # the next reader builds again


def test_the_patterns_page_does_not_wait_for_the_build_and_knows_the_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promotion needs to know which tools already provide a capability: during the build that comes from the
    registry itself (no health needed), so the page is the same as after the build, and never waits for it."""
    monkeypatch.setattr(views, "INLINE_TOOLS", 0)
    store = seeded_store(tmp_path / "state")
    store.record_regeneration(ArtifactCandidate(
        role="feeds", method_name="fetch", code="return 1\n", runtime_version="0.1.0", capabilities=["http_fetch"],
        cacheability=assess_cacheability("fetch", "return 1\n", [], {}, is_delegated_contract=False),
    ))  # fmt: skip
    store.record_success("feeds", "fetch")
    for _ in range(3):
        store.record_pattern("news", "headlines", ["http_fetch", "rss_parse"])
    gated = Gated(tmp_path)
    assert overview_page(gated.board).health_building is not None  # the build is held at the gate
    pages: list[Any] = []
    reader = threading.Thread(target=lambda: pages.append(patterns_page(gated.board)))
    reader.start()
    reader.join(WAIT / 2)
    assert not reader.is_alive() and pages, "the patterns page waited for the health build"
    during = pages[0].model_dump(mode="json")
    method = during["roles"][0]["methods"][0]
    # http_fetch is provided by the stored tool "feeds": only rss_parse is a capability to promote
    assert method["promotion_candidate"] and method["promotion_capabilities"] == ["rss_parse"]
    gated.finish()
    assert patterns_page(gated.board).model_dump(mode="json") == during
    gated.board.close()


def test_a_small_board_is_waited_for_whole(tmp_path: Path) -> None:
    """A board of at most INLINE_TOOLS tools: its first page waits past WAIT_S for the build (no notice)."""
    seeded_store(tmp_path / "state")
    g = Gated(tmp_path)
    release = threading.Timer(3 * views.WAIT_S, g.gate.set)  # the build lasts past the page's usual wait
    release.start()
    try:
        page = overview_page(g.board)
        assert g.gate.is_set()  # the page waited for the build (held back until then)
        assert page.health_building is None and page.badge_counts["healthy"] == len(ROLES)
    finally:
        release.cancel()
        g.gate.set()
        g.board.close()


def test_the_tool_count_is_the_registrys_without_decoding_it(tmp_path: Path) -> None:
    assert ToolStore(tmp_path / "none").tool_count() is None  # no registry
    store = seeded_store(tmp_path / "state")
    assert store.tool_count() == len(ROLES) == len(store.list_tools())
    code = "return 1\n"
    store.record_regeneration(ArtifactCandidate(
        role="extra", method_name="run", code=code, runtime_version="0.1.0", prompt_version=None,
        cacheability=assess_cacheability("run", code, [], {}, is_delegated_contract=False),
    ))  # fmt: skip
    assert ToolStore(tmp_path / "state").tool_count() == len(ROLES) + 1
