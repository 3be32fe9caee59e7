"""`sandforge chat` (driven by a scripted provider through CliRunner) and `sandforge sessions list|show`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from tests.sessions.helpers import ALL_GROUPS, call, load

GROUPS = [g.model_dump(mode="json", exclude_none=True) for g in ALL_GROUPS]


def _script(tmp_path: Path, turns: list[Any], **extra: Any) -> Path:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"groups": GROUPS, "turns": turns, **extra}))
    return path


def _run(args: list[str], state: Path, stdin: str = "") -> Result:
    return CliRunner().invoke(main, [*args, "--state-dir", str(state)], input=stdin, catch_exceptions=False)


def _chat(tmp_path: Path, turns: list[Any], stdin: str, *extra: str) -> Result:
    return _run(["chat", "--scripted", str(_script(tmp_path, turns)), *extra], tmp_path / "state", stdin)


def _sessions(tmp_path: Path, *args: str) -> Any:
    result = _run(["sessions", *args, "--json"], tmp_path / "state")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_chat_load_tools_clear_exit(tmp_path: Path) -> None:
    result = _chat(
        tmp_path,
        [load("google_gmail"), "Gmail is loaded.", "Fresh start."],
        "load gmail\n/tools\n/clear\n/tools\nhello\n/exit\n",
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "assistant> Gmail is loaded." in out
    assert "loaded:    google_gmail (gmail_search, gmail_trash)" in out
    assert "(core tools only)" in out
    assert out.count("loaded:    (none)") == 1  # after /clear
    assert "assistant> Fresh start." in out
    assert "[load_tool_group" in result.stderr and "-> success]" in result.stderr
    sessions = _sessions(tmp_path, "list")
    assert len(sessions) == 2
    newer, older = sessions
    assert newer["cleared_from"] == older["id"]
    shown = _sessions(tmp_path, "show", older["id"])
    assert shown["loaded_groups"] == ["google_gmail"]
    assert [m["type"] for m in shown["messages"]] == ["user", "tool_call", "tool_result", "assistant"]
    assert shown["messages"][1]["tool_input"] == '{"group_name": "google_gmail"}'
    assert _sessions(tmp_path, "show", newer["id"])["loaded_groups"] == []


@pytest.mark.parametrize(
    ("flag", "expected"), [((), "cannot run: no program provider"), (("--no-restore",), "not available")]
)
def test_resumed_chat_restores_groups(tmp_path: Path, flag: tuple[str, ...], expected: str) -> None:
    first = _chat(tmp_path, [load("google_gmail"), "ok"], "load gmail\n")
    assert first.exit_code == 0, first.output
    (session,) = _sessions(tmp_path, "list")
    resumed = _chat(
        tmp_path, [call("gmail_trash", id=1), "done"], "/tools\ntrash 1\n", "--session", session["id"][:6], *flag
    )
    assert resumed.exit_code == 0, resumed.output
    if not flag:
        assert "groups: google_gmail" in resumed.stdout and "loaded:    google_gmail" in resumed.stdout
    assert expected in resumed.stderr  # restored: the tool is active (it only lacks a program provider here)


def test_unknown_session_is_one_error_line(tmp_path: Path) -> None:
    result = _chat(tmp_path, ["x"], "", "--session", "nope")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no session 'nope'") and "Traceback" not in result.output
    shown = _run(["sessions", "show", "nope"], tmp_path / "state")
    assert shown.exit_code == 1 and shown.stderr.startswith("error: no session 'nope'")


def test_corrupt_database_is_one_error_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "sessions.db").write_bytes(b"garbage" * 1000)
    for args in (["sessions", "list"], ["chat", "--scripted", str(_script(tmp_path, ["x"]))]):
        result = _run(args, state)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: session database") and "corrupt" in result.stderr
        assert "Traceback" not in result.output


def test_bad_script_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"turns": [42]}')
    result = _run(["chat", "--scripted", str(path)], tmp_path / "state")
    assert result.exit_code == 2 and result.stderr.startswith("error: invalid scripted turn")


def test_chat_without_api_key_or_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    result = _run(["chat"], tmp_path / "state")
    assert result.exit_code == 1 and "no Anthropic API key" in result.stderr and "ANTHROPIC_API_KEY" in result.stderr


def test_exhausted_script_is_reported_and_the_chat_goes_on(tmp_path: Path) -> None:
    result = _chat(tmp_path, ["only answer"], "one\ntwo\n/help\n/bogus\n")
    assert result.exit_code == 0, result.output
    assert "assistant> only answer" in result.stdout
    assert "error: the scripted chat provider has no turn left" in result.stderr
    assert "unknown command /bogus" in result.stderr
    (session,) = _sessions(tmp_path, "list")
    assert session["message_count"] == 3  # both user messages are kept


def test_sessions_list_and_show_text(tmp_path: Path) -> None:
    assert _run(["sessions", "list"], tmp_path / "state").stdout == "no sessions\n"
    _chat(tmp_path, [load("calendar"), call("nope"), "Sorry."], "what's on today?\n")
    listing = _run(["sessions", "list"], tmp_path / "state").stdout
    assert "what's on today?" in listing
    (session,) = _sessions(tmp_path, "list")
    shown = _run(["sessions", "show", session["id"]], tmp_path / "state").stdout
    assert "groups   calendar" in shown
    assert 'tool_call    load_tool_group({"group_name": "calendar"}) -> success' in shown
    assert "tool_result  nope (error): Tool 'nope' is not available for this agent" in shown


def test_chat_runs_group_tools_through_the_agent_and_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole stack from the terminal: scripted chat + scripted programs, subprocess sandbox, call log."""
    monkeypatch.delenv("SANDFORGE_CALL_LOG", raising=False)  # the state directory's own log (tests/conftest.py)
    programs = [
        "context['q'] = kwargs['query']\nreturn ['m1', 'm2']",
        "return {'trashed': kwargs['id']}",
    ]
    turns = [load("google_gmail"), call("gmail_search", query="spam"), "2 found.", call("gmail_trash", id=2), "Gone."]
    path = _script(tmp_path, turns, programs=programs)
    result = _run(["chat", "--scripted", str(path), "--backend", "subprocess"], tmp_path / "state", "find\ntrash 2\n")
    assert result.exit_code == 0, result.output
    assert '[gmail_search({"query": "spam"}) -> success] ["m1", "m2"]' in result.stderr
    assert '[gmail_trash({"id": 2}) -> success] {"trashed": 2}' in result.stderr
    assert "assistant> Gone." in result.stdout
    log_lines = (tmp_path / "state" / "logs" / "calls.jsonl").read_text().splitlines()
    assert [json.loads(line)["method"] for line in log_lines] == ["search", "trash"]


def test_ctrl_c_during_a_turn_returns_to_the_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandforge.runtime.sessions import Session

    real_send = Session.send
    calls: list[str] = []

    def flaky_send(self: Session, text: str) -> Any:
        calls.append(text)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_send(self, text)

    monkeypatch.setattr(Session, "send", flaky_send)
    result = _chat(tmp_path, ["second try works"], "first\nsecond\n")
    assert result.exit_code == 0, result.output
    assert "(interrupted)" in result.stderr and "assistant> second try works" in result.stdout


def test_a_second_chat_reuses_the_tool_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 1 generates `gmail.search` and the store keeps it; run 2 (a new process's worth of objects, same
    state dir) calls it again with NO program scripted: it can only succeed from the persisted artifact."""
    monkeypatch.delenv("SANDFORGE_CALL_LOG", raising=False)  # the state directory's own log (tests/conftest.py)
    first = _script(tmp_path, [load("google_gmail"), call("gmail_search", query="a"), "done"],
                    programs=["return ['hit:' + kwargs['query']]"])  # fmt: skip
    result = _run(["chat", "--scripted", str(first), "--backend", "subprocess"], tmp_path / "state", "find\n")
    assert result.exit_code == 0, result.output
    assert '-> success] ["hit:a"]' in result.stderr

    second = tmp_path / "second.json"
    turns = [load("google_gmail"), call("gmail_search", query="b"), "done"]
    second.write_text(json.dumps({"groups": GROUPS, "programs": [], "turns": turns}))
    result = _run(["chat", "--scripted", str(second), "--backend", "subprocess"], tmp_path / "state", "again\n")
    assert result.exit_code == 0, result.output
    assert '-> success] ["hit:b"]' in result.stderr
    records = [json.loads(line) for line in (tmp_path / "state" / "logs" / "calls.jsonl").read_text().splitlines()]
    assert [r["program_source"] for r in records] == ["generated", "persisted"]
    assert records[1]["provider_calls"] == 0
