"""Concurrent sessions (threads, and processes sharing one database file) never see each other's groups."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

from sandforge.runtime.sessions import SessionStore
from tests.sessions.helpers import CORE, call, load, make_session

TOOLS = {
    "google_gmail": ["gmail_search", "gmail_trash"],
    "google_drive": ["drive_list"],
    "calendar": ["calendar_today"],
}
FIRST_TOOL = {
    "google_gmail": ("gmail_search", {"query": "q"}),
    "google_drive": ("drive_list", {}),
    "calendar": ("calendar_today", {}),
}
ROUNDS = 8


def _script(group: str) -> list[Any]:
    name, tool_input = FIRST_TOOL[group]
    turns: list[Any] = [load(group), "loaded"]
    for _ in range(ROUNDS):
        turns += [call(name, **tool_input), "done"]
    return turns


def _converse(store: SessionStore, group: str, barrier: Any) -> dict[str, Any]:
    session, provider = make_session(store, _script(group))
    barrier.wait()
    session.send(f"load {group}")
    statuses = []
    restored = []
    for i in range(ROUNDS):
        result = session.send(f"use it {i}")
        statuses += [c.status.value for c in result.tool_calls]
        restored.append(result.restored_groups)
    offered = [r.tool_names for r in provider.requests]
    return {"id": session.id, "statuses": statuses, "restored": restored, "offered": offered}


def _check(group: str, out: dict[str, Any]) -> None:
    assert out["statuses"] == ["success"] * ROUNDS
    assert out["restored"] == [[group]] * ROUNDS
    assert out["offered"][0] == CORE
    for names in out["offered"][1:]:
        assert names == CORE + TOOLS[group], names


def test_threads_on_one_store_do_not_share_groups(session_store: SessionStore) -> None:
    groups = list(TOOLS)
    barrier = threading.Barrier(len(groups))
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def worker(group: str) -> None:
        try:
            results[group] = _converse(session_store, group, barrier)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for group in groups:
        _check(group, results[group])
    ids = {r["id"] for r in results.values()}
    assert len(ids) == len(groups)
    for r in results.values():
        assert session_store.get_session(r["id"]).message_count == 4 + ROUNDS * 4


def test_threads_with_their_own_connections(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    barrier = threading.Barrier(2)
    results: dict[str, dict[str, Any]] = {}

    def worker(group: str) -> None:
        with SessionStore(path) as store:
            results[group] = _converse(store, group, barrier)

    threads = [threading.Thread(target=worker, args=(g,)) for g in ("google_gmail", "calendar")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _check("google_gmail", results["google_gmail"])
    _check("calendar", results["calendar"])


def _process_main(path: str, group: str, barrier: Any, queue: Any) -> None:
    try:
        with SessionStore(path, busy_timeout_s=30) as store:
            queue.put((group, _converse(store, group, barrier)))
    except BaseException as exc:
        queue.put((group, {"error": repr(exc)}))


def test_two_processes_on_one_database_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_process_main, args=(path, g, barrier, queue)) for g in ("google_gmail", "google_drive")
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for group, out in results.items():
        assert "error" not in out, out
        _check(group, out)
    with SessionStore(path) as store:
        listed = {s.id: s.message_count for s in store.list_sessions()}
    assert listed == {out["id"]: 4 + ROUNDS * 4 for out in results.values()}


def test_many_connections_opening_a_new_file_together(tmp_path: Path) -> None:
    """Switching a new file to WAL needs its exclusive lock, and SQLite answers SQLITE_BUSY at once (no busy
    wait) when two openers collide there; every opener must still get a store."""
    errors: list[BaseException] = []

    def opener(path: Path, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            with SessionStore(path) as store:
                store.create_session()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    for attempt in range(30):  # a collision happens in roughly one round in ten without the retry
        barrier = threading.Barrier(6)
        threads = [threading.Thread(target=opener, args=(tmp_path / f"{attempt}.db", barrier)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, (attempt, errors)
