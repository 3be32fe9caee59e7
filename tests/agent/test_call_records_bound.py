"""call_records in state.db is bounded (``call_records_max``): the newest records stay, the oldest the call log
already holds are pruned in the committing transaction, and a record not yet in the log is never pruned."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.agent.calllog import read_records
from sandforge.runtime.agent.statedb import CALL_RECORDS_MAX_ENV, DB_FILE_NAME, StateDB, StateDBError
from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest
from sandforge.sandbox import Sandbox, SandboxConfig
from sandforge.sandbox.context import ContextSnapshot


def _commit(db: StateDB, call_id: str, *, logged: bool = True) -> None:
    conflicts, _ = db.commit({"r": ContextSnapshot.from_dict({"last": call_id})}, None,
                             [(call_id, "t-" + call_id, "r", "m", "ok", f'{{"call_id": "{call_id}"}}')])  # fmt: skip
    assert conflicts == []
    if logged:  # what Workspace does once the line is in calls.jsonl
        db.logged([call_id])


def _ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT call_id FROM call_records ORDER BY rowid")]


def test_a_small_bound_keeps_the_newest_records(tmp_path: Path) -> None:
    path = tmp_path / DB_FILE_NAME
    db = StateDB(path, max_call_records=3)
    for i in range(3 + 4):
        _commit(db, f"c{i}")
    assert _ids(path) == ["c4", "c5", "c6"]
    assert db.record("c0") is None and db.record("c6") == '{"call_id": "c6"}'
    db.close()


def test_a_record_not_yet_in_the_call_log_is_never_pruned(tmp_path: Path) -> None:
    path = tmp_path / DB_FILE_NAME
    db = StateDB(path, max_call_records=2)
    for i in range(5):
        _commit(db, f"c{i}", logged=False)  # a crash before the lines were appended: recovery needs all five
    assert _ids(path) == [f"c{i}" for i in range(5)]
    db.logged([f"c{i}" for i in range(5)])
    _commit(db, "c5")
    assert _ids(path) == ["c4", "c5"]
    db.close()


def test_the_bound_is_configured_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CALL_RECORDS_MAX_ENV, "4")
    db = StateDB(tmp_path / DB_FILE_NAME)
    assert db.max_call_records == 4
    db.close()
    for bad in ("0", "many", "-3"):
        monkeypatch.setenv(CALL_RECORDS_MAX_ENV, bad)
        with pytest.raises(StateDBError, match=CALL_RECORDS_MAX_ENV):
            StateDB(tmp_path / DB_FILE_NAME)


def test_two_writers_pruning_lose_no_new_record(tmp_path: Path) -> None:
    """Two connections (as two processes on one tenant) commit and prune at once: each one's record is there
    right after its commit, and what is left is the bound's number of records, the newest of each writer."""
    path = tmp_path / DB_FILE_NAME
    bound, each = 5, 40
    writers = [StateDB(path, max_call_records=bound), StateDB(path, max_call_records=bound)]
    missing: list[str] = []
    start = threading.Barrier(2)

    def write(n: int) -> None:
        start.wait()
        for i in range(each):
            call_id = f"w{n}-{i}"
            _commit(writers[n], call_id)
            if writers[n].record(call_id) is None:
                missing.append(call_id)

    threads = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert missing == []
    ids = _ids(path)
    assert len(ids) == bound
    assert ids[-1] in {f"w{n}-{each - 1}" for n in (0, 1)}  # the last commit of all is kept
    for n in (0, 1):  # of each writer, what is kept is its newest records: an older one never outlives a newer
        kept = sorted(int(i.split("-")[1]) for i in ids if i.startswith(f"w{n}-"))
        assert kept == list(range(each - len(kept), each))
    for db in writers:
        db.close()


# --- through a Workspace: the agent's commits, the call log, the bound ---------------------------------------

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']"


class Programs:
    name = "programs"

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        return GeneratedProgram(code=INCR)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1))
    yield sb
    sb.close()


def _workspace(state: Path, sandbox: Sandbox, log: Path) -> Workspace:
    return Workspace(provider=Programs(), sandbox=sandbox, log=log, state_dir=state)  # type: ignore[arg-type]


def test_a_workspace_keeps_the_newest_records_and_the_log_keeps_all(
    tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CALL_RECORDS_MAX_ENV, "3")
    log = tmp_path / "calls.jsonl"
    with _workspace(tmp_path / "state", sandbox, log) as ws:
        assert [ws.call("counter", "incr").value for _ in range(3 + 2)] == [1, 2, 3, 4, 5]
    every = [r.call_id for r in read_records(log)]
    assert len(every) == 5
    assert _ids(tmp_path / "state" / DB_FILE_NAME) == every[-3:]


def test_a_record_whose_log_line_was_not_written_is_kept_unlogged(
    tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk or an unwritable log: the record stays ``logged = 0``, so pruning keeps it and the next
    process appends it (it used to be marked logged, the line lost for good)."""
    monkeypatch.setenv(CALL_RECORDS_MAX_ENV, "1")
    log = tmp_path / "calls.jsonl"
    log.mkdir()  # not a regular file: every append fails
    with _workspace(tmp_path / "state", sandbox, log) as ws:
        assert [ws.call("counter", "incr").value for _ in range(3)] == [1, 2, 3]
    with sqlite3.connect(tmp_path / "state" / DB_FILE_NAME) as conn:
        assert [r[0] for r in conn.execute("SELECT logged FROM call_records")] == [0, 0, 0]
