"""Durable tool state (issue 37, item 4): a workspace given a state directory commits each role's context to
``state.db`` in the transaction that writes the records of the calls that changed it; another workspace (another
process) on the same directory sees one state, and a commit either side refused leaves nothing behind."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent.calllog import CallLog, read_records
from sandforge.runtime.agent.statedb import DB_FILE_NAME, StateDB
from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest
from sandforge.sandbox import Sandbox, SandboxConfig

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']"


class Programs:
    """Writes the same program for every method (thread-safe: it keeps nothing)."""

    name = "programs"

    def __init__(self, code: str = INCR) -> None:
        self.code = code

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        return GeneratedProgram(code=self.code)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=2))
    yield sb
    sb.close()


def _ws(state: Path, sandbox: Sandbox, log: CallLog | bool = False) -> Workspace:
    return Workspace(provider=Programs(), sandbox=sandbox, log=log, state_dir=state)  # type: ignore[arg-type]


def _records(state: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(state / DB_FILE_NAME) as conn:
        return [(str(r[0]), str(r[1])) for r in conn.execute("SELECT role, status FROM call_records")]


def test_a_committed_context_outlives_its_workspace(tmp_path: Path, sandbox: Sandbox) -> None:
    with _ws(tmp_path, sandbox) as ws:
        assert [ws.call("counter", "incr").value for _ in range(3)] == [1, 2, 3]
    with _ws(tmp_path, sandbox) as again:
        assert again.context("counter") == {"n": 3}
        assert again.call("counter", "incr").value == 4


def test_without_a_state_directory_the_workspace_keeps_contexts_in_memory(tmp_path: Path, sandbox: Sandbox) -> None:
    with Workspace(provider=Programs(), sandbox=sandbox, log=False) as ws:  # type: ignore[arg-type]
        ws.set_context("counter", {"n": 1})
        assert ws.call("counter", "incr").value == 2
    assert not list(tmp_path.iterdir())


def test_two_workspaces_on_one_state_directory_lose_no_update(tmp_path: Path, sandbox: Sandbox) -> None:
    # two workspaces are two gates, as two processes are: each refuses a commit the other changed underneath
    first, second = _ws(tmp_path, sandbox), _ws(tmp_path, sandbox)
    try:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda i: (first, second)[i % 2].call("counter", "incr"), range(12)))
        assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
        assert sorted(o.value for o in outcomes) == list(range(1, 13))  # each saw the commit before it
        assert first.context("counter") == second.context("counter") == {"n": 12}
        assert _records(tmp_path) == [("counter", "ok")] * 12  # a refused commit wrote no record either
    finally:
        first.close()
        second.close()


def test_a_stale_replace_changes_nothing(tmp_path: Path, sandbox: Sandbox) -> None:
    with _ws(tmp_path, sandbox) as ws, _ws(tmp_path, sandbox) as other:
        start = ws.committed("r")
        assert start.version == 0 and dict(start.snapshot) == {}
        now, written = ws.replace_context("r", {"a": 1}, if_match=start.etag)
        assert written and now.version == 1 and now.etag != start.etag
        stale, written = other.replace_context("r", {"a": 2}, if_match=start.etag)
        assert not written and stale.etag == now.etag
        assert other.context("r") == ws.context("r") == {"a": 1}
        _, written = other.replace_context("r", {"a": 3}, if_match="*")
        assert written and ws.context("r") == {"a": 3}


def test_a_record_a_stopped_process_committed_reaches_the_call_log_once(tmp_path: Path, sandbox: Sandbox) -> None:
    with _ws(tmp_path / "model", sandbox) as ws:
        ws.call("counter", "incr")
        model = ws.log.records[0]
    lost, appended = (model.model_copy(update={"call_id": cid}) for cid in ("c-lost", "c-appended"))
    # a process that committed both and was gone before it marked them logged: it had appended one of them
    child = (
        "import sys\nfrom pathlib import Path\nfrom sandforge.runtime.agent.statedb import StateDB\n"
        "from sandforge.sandbox.context import ContextSnapshot\n"
        "db = StateDB(Path(sys.argv[1]))\nlost, appended = sys.stdin.read().split('\\n')\n"
        "db.commit({'counter': ContextSnapshot.from_dict({'n': 41})}, {}, "
        "[('c-lost', 't', 'counter', 'incr', 'ok', lost), ('c-appended', 't', 'counter', 'incr', 'ok', appended)])\n"
    )
    subprocess.run([sys.executable, "-c", child, str(tmp_path / DB_FILE_NAME)], text=True, check=True, timeout=60,
                   input=lost.model_dump_json() + "\n" + appended.model_dump_json())  # fmt: skip
    log_path = tmp_path / "calls.jsonl"
    CallLog(log_path).append(appended)
    with _ws(tmp_path, sandbox, CallLog(log_path)) as ws:
        assert ws.context("counter") == {"n": 41}
    assert [r.call_id for r in read_records(log_path)] == ["c-appended", "c-lost"]  # each once
    with _ws(tmp_path, sandbox, CallLog(log_path)):
        pass
    assert len(list(read_records(log_path))) == 2  # marked logged now: never written again
    assert json.loads(StateDB(tmp_path / DB_FILE_NAME).record("c-lost") or "{}")["role"] == "counter"


def test_a_state_database_from_a_newer_sandforge_is_refused_in_one_line(tmp_path: Path) -> None:
    from sandforge.runtime.agent.statedb import StateDBError

    StateDB(tmp_path / DB_FILE_NAME).close()
    with sqlite3.connect(tmp_path / DB_FILE_NAME) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StateDBError) as info:
        StateDB(tmp_path / DB_FILE_NAME)
    assert "schema version 99" in str(info.value) and "\n" not in str(info.value)


def test_two_connections_of_one_process_keep_their_locks(tmp_path: Path) -> None:
    # opening the database a second time must not drop the first connection's POSIX locks (closing any
    # descriptor of the file would): another process closing its last connection would then take the file for
    # its own, checkpoint and delete the WAL under this process, whose later commits (answered, on disk in a
    # deleted file) a kill -9 then loses
    path = tmp_path / DB_FILE_NAME
    holder = (
        "import sys\nfrom pathlib import Path\nfrom sandforge.runtime.agent.statedb import StateDB\n"
        "from sandforge.sandbox.context import ContextSnapshot\n"
        "first = StateDB(Path(sys.argv[1]))\nsecond = StateDB(Path(sys.argv[1]))\n"
        "for line in sys.stdin:\n"
        "    first.replace('a', ContextSnapshot.from_dict({'n': int(line)}), None)\n"
        "    print('committed', flush=True)\n"
    )
    other = (
        "import sys\nfrom pathlib import Path\nfrom sandforge.runtime.agent.statedb import StateDB\n"
        "from sandforge.sandbox.context import ContextSnapshot\n"
        "db = StateDB(Path(sys.argv[1]))\ndb.replace('b', ContextSnapshot.from_dict({'n': 1}), None)\ndb.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("1\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "committed\n"
        subprocess.run([sys.executable, "-c", other, str(path)], check=True, timeout=60)
        proc.stdin.write("2\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "committed\n"  # answered: it must survive the kill
    finally:
        proc.kill()
        proc.wait()
    with sqlite3.connect(path) as conn:
        rows = dict(conn.execute("SELECT role, body FROM contexts").fetchall())
    assert {role: json.loads(body) for role, body in rows.items()} == {"a": {"n": 2}, "b": {"n": 1}}


def test_a_call_that_never_commits_cleanly_is_a_retriable_conflict_never_an_overwrite(
    tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandforge.runtime.agent import workspace as workspace_module

    monkeypatch.setattr(workspace_module, "RERUNS", 2)
    first, second = _ws(tmp_path, sandbox), _ws(tmp_path, sandbox)
    try:
        first.call("counter", "incr")
        real = first._state.db.commit  # type: ignore[union-attr]

        def another_process_commits_first(contexts: Any, bases: Any, rows: Any) -> Any:
            second.call("counter", "incr")  # always one step ahead of first's commit
            return real(contexts, bases, rows)

        monkeypatch.setattr(first._state.db, "commit", another_process_commits_first)
        outcome = first.call("counter", "incr")
        assert (outcome.status, outcome.error_type, outcome.retriable) == ("error", "state_conflict", True)
        monkeypatch.undo()
        # first's three attempts each lost to one of second's commits: all three kept, none of first's
        assert second.context("counter") == first.context("counter") == {"n": 1 + 3}
    finally:
        first.close()
        second.close()
