"""The call-log index's background build: pages answer while it runs (never behind a lock held by the build),
a build killed mid-way resumes where it stopped and loses or repeats nothing, two processes never index the
same bytes twice, and the pages and their JSON twins say how far it got."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sandforge.runtime.dashboard import callindex
from sandforge.runtime.dashboard.callindex import CallFilter, CallIndex
from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from tests.dashboard.test_callindex import _line

ROOT = Path(__file__).resolve().parents[2]


def _log(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(_line(i, status="error" if i % 5 == 0 else "ok") for i in range(n)))
    return path


def _wait(cond: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.01)


def _check_complete(index: CallIndex, n: int) -> None:
    """Every record indexed exactly once, the hourly counts adding up to the records."""
    with sqlite3.connect(index.index_path) as db:
        ids = [r[0] for r in db.execute("SELECT call_id FROM calls")]
        hours = db.execute("SELECT COALESCE(SUM(n), 0) FROM hours").fetchone()[0]
    assert sorted(ids) == [f"{i:016x}" for i in range(n)]
    assert hours == n


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Batches of 10 records; the build stops inside its second commit (holding the writer's lock) until set."""
    monkeypatch.setattr(callindex, "BATCH", 10)
    gate = threading.Event()
    inside = threading.Event()
    real = CallIndex._commit
    commits = [0]

    def commit(db: sqlite3.Connection, rows: list[tuple[Any, ...]], start: int, offset: int) -> bool:
        commits[0] += 1
        if commits[0] == 2:
            inside.set()
            assert gate.wait(30), "the test never released the build"
        return real(db, rows, start, offset)

    monkeypatch.setattr(CallIndex, "_commit", staticmethod(commit))
    gate.inside = inside  # type: ignore[attr-defined]
    yield gate
    gate.set()


def test_a_page_answers_at_once_while_the_build_holds_its_lock(tmp_path: Path, held: threading.Event) -> None:
    log = _log(tmp_path / "calls.jsonl", 100)
    index = CallIndex(log, inline_bytes=500)
    first = index.page(CallFilter(), 50)  # starts the build in the background; never waits for it
    assert held.inside.wait(10)  # type: ignore[attr-defined]
    answered: list[Any] = []
    reader = threading.Thread(target=lambda: answered.append((index.page(CallFilter(), 50), index.progress())))
    reader.start()
    reader.join(10)
    assert answered, "a page waited for the build's lock"
    rows, progress = answered[0]
    assert len(first) <= 10
    assert [r.call_id for r in rows] == [f"{i:016x}" for i in range(9, -1, -1)]  # what is indexed so far
    assert progress.building and progress.indexed_records == 10
    assert progress.indexed_bytes < progress.log_bytes == log.stat().st_size
    assert progress.estimated_records == 100  # the first ten are a fair sample here: the estimate is exact
    held.set()
    _wait(lambda: not index.building(), "the build to finish")
    assert index.total() == 100 and not index.progress().building
    _check_complete(index, 100)
    index.close()


def test_after_the_build_appends_are_indexed_by_the_read_that_finds_them(tmp_path: Path) -> None:
    log = _log(tmp_path / "calls.jsonl", 60)
    index = CallIndex(log, inline_bytes=len(_line(0)) * 3)
    index.total()
    _wait(lambda: not index.building(), "the build to finish")
    assert index.total() == 60
    with log.open("a") as fh:
        fh.write(_line(60) + _line(61))  # a short tail: no build, the next page shows it
    assert not index.building()
    assert [r.call_id for r in index.page(CallFilter(), 2)] == [f"{61:016x}", f"{60:016x}"]
    with log.open("a") as fh:
        fh.write("".join(_line(i) for i in range(62, 80)))  # a long one: in the background again
    index.total()
    _wait(lambda: not index.building(), "the second build to finish")
    _check_complete(index, 80)
    index.close()


def test_a_build_killed_mid_way_resumes_and_loses_or_repeats_nothing(tmp_path: Path) -> None:
    n = 3000
    log = _log(tmp_path / "calls.jsonl", n)
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from sandforge.runtime.dashboard import callindex
        callindex.BATCH = 50
        real = callindex.CallIndex._commit
        def slow(db, rows, start, offset):
            time.sleep(0.02)
            return real(db, rows, start, offset)
        callindex.CallIndex._commit = staticmethod(slow)
        callindex.CallIndex(callindex.Path({str(log)!r}), inline_bytes=100).total()
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    index_path = log.with_suffix(".index.sqlite")

    def offset() -> int:
        try:
            with sqlite3.connect(index_path, timeout=5) as db:
                row = db.execute("SELECT value FROM meta WHERE key = 'offset'").fetchone()
        except sqlite3.OperationalError:
            return 0
        return int(row[0]) if row else 0

    try:
        _wait(lambda: offset() > 0, "the first batch")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = offset()
    assert 0 < killed_at < log.stat().st_size  # killed mid-build
    index = CallIndex(log, inline_bytes=100)
    assert index.total() >= killed_at // len(_line(0))  # what was committed is there at once
    _wait(lambda: not index.building(), "the resumed build")
    index.total()
    _wait(lambda: not index.building(), "the resumed build")
    _check_complete(index, n)
    index.close()


def test_two_processes_building_at_once_never_index_the_same_bytes_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(callindex, "BATCH", 7)
    log = _log(tmp_path / "calls.jsonl", 400)
    a, b = CallIndex(log, inline_bytes=10), CallIndex(log, inline_bytes=10)  # a connection pair each
    a.total(), b.total()
    for _ in range(3):  # a builder that lost a race stops; the next read starts it again
        _wait(lambda: not a.building() and not b.building(), "both builds")
        a.total(), b.total()
    _wait(lambda: not a.building() and not b.building(), "both builds")
    _check_complete(a, 400)
    a.close()
    b.close()


def test_pages_and_twins_say_the_index_is_being_built(tmp_path: Path, held: threading.Event) -> None:
    monkeypatch_inline = pytest.MonkeyPatch()
    monkeypatch_inline.setattr(callindex, "INLINE_BYTES", 500)
    try:
        state = tmp_path / "alpha"
        log = _log(state / "logs" / "calls.jsonl", 100)
        first_ten = len(b"".join(log.read_bytes().splitlines(keepends=True)[:10]))
        token = new_token()
        tenant = {"name": "alpha", "state_dir": str(state), "token_hashes": [hash_token(token)]}
        config = parse_server_config({"state_dir": str(tmp_path), "tenants": [tenant]}, base=tmp_path)
        app = create_app(config, audit=AuditLog(None))
        with TestClient(app.state.gate, base_url="https://testserver") as c:
            c.headers["Authorization"] = f"Bearer {token}"
            c.get("/v1/dashboard/calls")
            assert held.inside.wait(10)  # type: ignore[attr-defined]
            twin = c.get("/v1/dashboard/overview").json()
            assert twin["indexed_calls"] == 10
            assert twin["indexing"] == {
                "indexed_records": 10,
                "estimated_records": 100,
                "indexed_bytes": first_ten,
                "log_bytes": log.stat().st_size,
            }
            assert c.get("/v1/dashboard/calls").json()["indexing"]["indexed_records"] == 10
            c.post("/dashboard/login", data={"token": token})
            page = c.get("/dashboard/calls").text
            assert "indexing: 10 of about 100 records (10% of the call log)" in page
            held.set()
            _wait(lambda: c.get("/v1/dashboard/calls").json()["indexing"] is None, "the build")
            assert c.get("/v1/dashboard/overview").json()["indexed_calls"] == 100
            assert 'id="indexing"' not in c.get("/dashboard").text
    finally:
        held.set()
        monkeypatch_inline.undo()


def test_the_build_steps_aside_while_a_page_is_being_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One interpreter lock for the page and the build: the build waits while a page is built."""
    monkeypatch.setattr(callindex, "BATCH", 10)
    monkeypatch.setattr(callindex, "READER_PAUSE_S", 120.0)
    log = _log(tmp_path / "calls.jsonl", 200)
    index = CallIndex(log, inline_bytes=100)
    with index.reading():
        index.total()  # starts the build, which finds a page being built before its first commit
        _wait(lambda: index.pauses > 0, "the build to step aside")
        assert index.progress().indexed_records == 0 and index.building()
    _wait(lambda: not index.building(), "the build to finish once the page is done")
    _check_complete(index, 200)
    index.close()


def test_a_page_indexing_a_short_tail_itself_never_waits_for_itself(tmp_path: Path) -> None:
    log = _log(tmp_path / "calls.jsonl", 300)
    index = CallIndex(log)  # 300 records: under the inline bound, indexed by the read
    with index.reading():
        assert index.total() == 300
    assert index.pauses == 0 and not index.building()
    index.close()
