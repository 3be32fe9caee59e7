"""`sandforge context show|set ROLE` (issue 37, item 4): the committed context of a state directory, the one the
workspace of `serve` and `mcp` commits to; typed one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.cli import main
from sandforge.runtime.providers import ScriptedProvider

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"


def invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_show_and_set_work_on_what_calls_commit(tmp_path: Path) -> None:
    state = str(tmp_path)
    assert invoke("context", "show", "counter", "--state-dir", state) == (0, "{}\n", "")
    code, out, _ = invoke("context", "set", "counter", '{"n": 16}', "--state-dir", state)
    assert code == 0 and out.startswith("counter: version 1, etag "), out
    with Workspace(provider=ScriptedProvider([INCR]), sandbox="subprocess", log=False, state_dir=tmp_path) as ws:
        assert ws.call("counter", "incr").value == 17  # a call counts on from what `set` committed
    code, out, _ = invoke("context", "show", "counter", "--state-dir", state, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["context"] == {"n": 17} and shown["version"] == 2, shown
    # --if-match: the current ETag writes, a stale one changes nothing (exit 1, one line)
    assert invoke("context", "set", "counter", "--file", "-", "--if-match", shown["etag"], "--state-dir", state,
                  stdin='{"n": 0}')[0] == 0  # fmt: skip
    code, _, err = invoke("context", "set", "counter", "{}", "--if-match", shown["etag"], "--state-dir", state)
    assert code == 1 and err.count("\n") == 1 and "changed" in err, err
    assert json.loads(invoke("context", "show", "counter", "--state-dir", state)[1]) == {"n": 0}


def test_bad_input_is_a_one_line_usage_error(tmp_path: Path) -> None:
    state = str(tmp_path)
    (tmp_path / "list.json").write_text("[1]")
    for args in (
        ("set", "r", "[1]"),  # not an object
        ("set", "r", '{"a": NaN}'),  # not JSON
        ("set", "r", "{"),
        ("set", "r"),  # neither JSON nor --file
        ("set", "r", "{}", "--file", str(tmp_path / "list.json")),  # both
        ("set", "r", "--file", str(tmp_path / "list.json")),
        ("set", "r", "--file", str(tmp_path / "missing.json")),
        ("show", "bad name"),
    ):
        code, out, err = invoke("context", *args, "--state-dir", state)
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err
    assert json.loads(invoke("context", "show", "r", "--state-dir", state)[1]) == {}  # nothing was written


def test_a_state_database_that_is_not_one_is_a_one_line_error(tmp_path: Path) -> None:
    import os

    for name, make in (("garbage", lambda p: p.write_bytes(b"not sqlite" * 100)), ("fifo", os.mkfifo),
                       ("dir", Path.mkdir)):  # fmt: skip
        state = tmp_path / name
        state.mkdir()
        make(state / "state.db")
        code, out, err = invoke("context", "show", "r", "--state-dir", str(state))
        assert code == 1 and out == "" and err.startswith("error: state database ") and err.count("\n") == 1, err
