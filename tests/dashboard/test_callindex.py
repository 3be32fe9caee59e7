"""The call-log index: caught up incrementally, rebuilt when the log is replaced or shrinks, never fooled by
a half-written line, a foreign line or a FIFO; counts per hour add up."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sandforge.runtime.agent.calllog import CallRecord
from sandforge.runtime.dashboard.callindex import CallFilter, CallIndex, SecurityFilter

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _line(i: int, *, status: str = "ok", role: str = "calc", at: datetime | None = None, **extra: Any) -> str:
    fields: dict[str, Any] = dict(
        trace_id=f"{i:032x}", call_id=f"{i:016x}", depth=0, role=role, method="add", started_at=at or T0,
        duration_s=0.1, status=status, attempt_id="a" * 16, attempts=1, attempt_stage="executed",
    )  # fmt: skip
    if status == "error":
        fields |= {"error_type": "execution_error", "latest_failure_stage": "execution"}
    return CallRecord(**(fields | extra)).model_dump_json() + "\n"


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


def test_catches_up_with_appended_records_only(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    log.write_text("".join(_line(i) for i in range(3)))
    index = CallIndex(log)
    assert index.total() == 3
    _append(log, _line(3, status="error", role="fetch"))
    assert [c.call_id for c in index.page(CallFilter(status="error"), 10)] == [f"{3:016x}"]
    assert index.total() == 4
    expected = CallRecord.model_validate_json(_line(3, status="error", role="fetch"))
    assert index.record(index.page(CallFilter(role="fetch"), 1)[0]) == expected


def test_a_half_written_line_waits_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    whole = _line(1)
    log.write_text(_line(0) + "not json\n" + json.dumps({"schema_version": 9}) + "\n" + whole[:40])
    index = CallIndex(log)
    assert index.total() == 1
    _append(log, whole[40:])
    assert [c.call_id for c in index.page(CallFilter(), 10)] == [f"{1:016x}", f"{0:016x}"]


def test_a_replaced_or_truncated_log_is_indexed_again(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    log.write_text("".join(_line(i) for i in range(5)))
    index = CallIndex(log)
    assert index.total() == 5
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(_line(7))
    os.replace(replacement, log)
    assert [c.call_id for c in index.page(CallFilter(), 10)] == [f"{7:016x}"]
    log.write_text("")
    assert index.page(CallFilter(), 10) == []


def test_a_fifo_in_place_of_the_log_is_not_read(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    os.mkfifo(log)
    assert CallIndex(log).page(CallFilter(), 10) == []  # returns at once: never blocks on the FIFO


def test_filters_time_keyset_and_hours(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    log.write_text("".join(
        _line(i, status="error" if i % 4 == 0 else "ok", at=T0 + timedelta(minutes=20 * i)) for i in range(12)
    ))  # fmt: skip
    index = CallIndex(log)
    since = (T0 + timedelta(hours=2)).timestamp()
    assert [c.id for c in index.page(CallFilter(since=since), 50)] == list(range(12, 6, -1))
    assert [c.id for c in index.page(CallFilter(before=4), 50)] == [3, 2, 1]
    assert [c.id for c in index.page(CallFilter(stage="none"), 50)] == [c for c in range(12, 0, -1) if (c - 1) % 4]
    hours = index.hourly(int(T0.timestamp() // 3600))
    assert sum(n for _, _, _, n in hours) == 12 and sum(n for _, e, _, n in hours if e) == 3
    assert index.count_since(T0.timestamp()) == (12, 3, 0)
    assert (tmp_path / "calls.index.sqlite").stat().st_mode & 0o777 == 0o600


def test_an_over_long_line_is_skipped_and_what_follows_is_indexed(tmp_path: Path, monkeypatch: Any) -> None:
    from sandforge.runtime.dashboard import callindex

    monkeypatch.setattr(callindex, "MAX_LINE_BYTES", 4096)
    log = tmp_path / "calls.jsonl"
    log.write_text(_line(0) + "x" * 10_000)
    index = CallIndex(log)
    assert index.total() == 1  # the long line has no end yet
    _append(log, "\n" + _line(2))
    assert [c.call_id for c in index.page(CallFilter(), 10)] == [f"{2:016x}", f"{0:016x}"]


def _security_event(i: int, attempt: int, source: str = "tripwire", event: str = "open") -> dict[str, Any]:
    return {"source": source, "event": event, "detail": f"event {i}.{attempt}", "attempt_id": f"{i:016x}.{attempt}",
            "attempt_number": attempt, "role": "calc", "method": "add",
            "timestamp": (T0 + timedelta(seconds=attempt)).isoformat()}  # fmt: skip


def test_security_events_are_indexed_one_row_each_and_filtered(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    two = [_security_event(1, 1), _security_event(1, 2, "inner_wall", "withheld_name")]
    log.write_text(_line(0) + _line(1, status="error", security_events=two) + _line(2, security_events=[
        _security_event(2, 1, "host", "unclean_exit_after_ok")]))  # fmt: skip
    index = CallIndex(log)
    events = index.security_events(SecurityFilter(), 10)
    assert [(e.call.call_id, e.n, e.source, e.event, e.attempt) for e in events] == [
        (f"{2:016x}", 0, "host", "unclean_exit_after_ok", 1),
        (f"{1:016x}", 1, "inner_wall", "withheld_name", 2),
        (f"{1:016x}", 0, "tripwire", "open", 1),
    ]
    assert events[1].t == (T0 + timedelta(seconds=2)).timestamp()
    assert [e.event for e in index.security_events(SecurityFilter(source="tripwire"), 10)] == ["open"]
    assert [e.n for e in index.security_events(SecurityFilter(before=events[0].id), 10)] == [1, 0]
    assert [(c.call_id, c.security) for c in index.page(CallFilter(security=True), 10)] == [
        (f"{2:016x}", 1), (f"{1:016x}", 2)
    ]  # fmt: skip
    assert index.security_total() == 3


def test_an_index_of_the_previous_version_is_rebuilt_with_the_security_events(tmp_path: Path) -> None:
    """An index written before issue 36 (no security column or table) is dropped and built again from the log."""
    import sqlite3

    log = tmp_path / "calls.jsonl"
    log.write_text(_line(0) + _line(1, security_events=[_security_event(1, 1)]))
    old = sqlite3.connect(log.with_suffix(".index.sqlite"))
    old.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE calls (id INTEGER PRIMARY KEY, off INTEGER NOT NULL, len INTEGER NOT NULL, t REAL NOT NULL,"
        " role TEXT NOT NULL, method TEXT NOT NULL, status TEXT NOT NULL, error_type TEXT, stage TEXT,"
        " failure_class TEXT, trace TEXT NOT NULL, call_id TEXT NOT NULL, parent TEXT, depth INTEGER NOT NULL,"
        " duration REAL NOT NULL, attempts INTEGER NOT NULL);"
        "CREATE TABLE hours (hour INTEGER NOT NULL, error_type TEXT NOT NULL, n INTEGER NOT NULL,"
        " PRIMARY KEY (hour, error_type)) WITHOUT ROWID;"
        f"INSERT INTO meta VALUES ('version', '1'), ('offset', '{log.stat().st_size}'),"
        f" ('identity', '{log.stat().st_dev}:{log.stat().st_ino}');"
    )
    old.close()
    index = CallIndex(log)
    assert index.total() == 2
    assert [e.call.call_id for e in index.security_events(SecurityFilter(), 10)] == [f"{1:016x}"]
