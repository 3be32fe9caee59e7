"""The CLI reports like the tools people already use (issue 21): distinct exit codes, JSON errors under --json,
--version, defaults in --help, ``exec -``, RFC 3339 UTC timestamps, messages naming the user's flag, Ctrl-C."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import exec_cmd, main
from sandforge.runtime.cli.exits import Exit, for_outcome, json_requested
from sandforge.runtime.cli.output import rfc3339
from sandforge.runtime.cli.progress import Steps

SANDFORGE = Path(sys.executable).parent / "sandforge"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def program(tmp_path: Path, code: str) -> str:
    path = tmp_path / "p.py"
    path.write_text(code)
    return str(path)


def error_object(result: Result) -> dict[str, object]:
    """The one JSON object a --json error prints on stderr (nothing else there, nothing on stdout)."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert result.stdout == "", result.stdout
    error = json.loads(lines[0])["error"]
    assert isinstance(error, dict)
    return error


# --- exit codes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("return 1\n", Exit.OK),
        ("return 1 / 0\n", Exit.FAILED),
        ("import os\nreturn 1\n", Exit.REJECTED_RECOVERABLE),
        ("import socket\nreturn 1\n", Exit.REJECTED_TERMINAL),
        ("while True:\n    pass\n", Exit.LIMIT),
        ("x = 'y' * (70 * 1024)\nprint(x)\nreturn 1\n", Exit.LIMIT),  # output over max_output_bytes
    ],
)
def test_each_outcome_has_its_exit_code(tmp_path: Path, code: str, expected: Exit) -> None:
    result = invoke("exec", program(tmp_path, code), "--timeout", "1", "--json")
    assert result.exit_code == expected, (result.stdout, result.stderr)
    outcome = json.loads(result.stdout)  # --json: the outcome is printed whatever the exit code
    assert outcome["status"] == ("ok" if expected == Exit.OK else "error")


def test_an_unavailable_sandbox_exits_6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = invoke("exec", program(tmp_path, "return 1\n"), "--backend", "docker", "--json")
    assert result.exit_code == Exit.UNAVAILABLE, result.output
    assert json.loads(result.stdout)["error_type"] == "sandbox_unavailable"
    doctor = invoke("doctor", "--backend", "docker")
    assert doctor.exit_code == Exit.UNAVAILABLE and "FAIL docker" in doctor.stdout


def test_the_codes_are_distinct_and_documented() -> None:
    values = [e.value for e in Exit]
    assert len(values) == len(set(values)) == 9
    assert values == [0, 1, 2, 3, 4, 5, 6, 7, 130]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for e in Exit:
        assert re.search(rf"^\| {e.value} \|", readme, re.MULTILINE), f"exit {e.value} is not in the README's table"


def test_for_outcome_reads_the_verdict_only_for_rejections() -> None:
    assert for_outcome(False, "execution", "recoverable") == Exit.FAILED
    assert for_outcome(False, "guardrail_violation", None) == Exit.FAILED
    assert for_outcome(False, "invalid_code", "recoverable") == Exit.REJECTED_RECOVERABLE
    assert for_outcome(False, "memory_limit") == Exit.LIMIT


def test_ctrl_c_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(exec_cmd, "guarded_execute", interrupted)
    result = invoke("exec", program(tmp_path, "return 1\n"))
    assert result.exit_code == 130 and "interrupted" in result.stderr and "Traceback" not in result.output
    assert error_object(invoke("exec", program(tmp_path, "return 1\n"), "--json")) == {
        "type": "interrupted", "message": "interrupted", "exit_code": 130}  # fmt: skip


# --- errors under --json --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kind", "needle"),
    [
        (["exec", "--bogus", "--json"], "usage_error", "No such option '--bogus'"),
        (["nope", "--json"], "usage_error", "No such command 'nope'"),
        (["exec", "P", "--timeout", "soon", "--json"], "usage_error", "'soon' is not a valid float"),
        (["exec", "P", "--args", "[1,", "--json"], "input_file_error", "--args is not valid JSON"),
        (["exec", "P", "--timeout", "-1", "--json"], "usage_error", "invalid --timeout"),
        (["exec", "/nonexistent/p.py", "--json"], "input_file_missing", "/nonexistent/p.py"),
        (["tools", "--json", "show", "x"], "usage_error", "No such option"),
    ],
)
def test_usage_errors_are_one_json_object_on_stderr(tmp_path: Path, args: list[str], kind: str, needle: str) -> None:
    args = [program(tmp_path, "return 1\n") if a == "P" else a for a in args]
    result = invoke(*args)
    error = error_object(result)
    assert result.exit_code == 2 == error["exit_code"]
    assert error["type"] == kind and needle in str(error["message"])


def test_without_json_usage_errors_stay_text(tmp_path: Path) -> None:
    result = invoke("exec", "--bogus")
    assert result.exit_code == 2 and "Error: No such option '--bogus'" in result.stderr
    assert not result.stderr.lstrip().startswith("{")


def test_json_is_looked_for_before_a_double_dash_only() -> None:
    assert json_requested(["exec", "p.py", "--json"]) and not json_requested(["exec", "--", "--json"])


# --- the rest -------------------------------------------------------------------------------------


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and re.fullmatch(r"sandforge \d+\.\d+\.\d+\S*\n", result.stdout)


def test_help_shows_defaults() -> None:
    assert "[default: subprocess]" in invoke("demo", "--help").stdout
    assert "[default: 5]" in invoke("exec", "--help").stdout
    assert "[default: 256]" in invoke("exec", "--help").stdout


def test_exec_dash_reads_the_program_from_standard_input() -> None:
    result = invoke("exec", "-", "--args", "[20]", "--json", stdin="return args[0] + 1\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["value"] == 21


def test_exec_dash_is_bounded_like_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exec_cmd, "output_limit", exec_cmd.output_limit)  # unchanged: the bound is the message limit
    result = invoke("exec", "-", "--json", stdin="#" * (32 * 1024 * 1024 + 10))
    error = error_object(result)
    assert result.exit_code == 2 and "larger than" in str(error["message"])


def test_timestamps_are_rfc3339_utc() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert RFC3339_UTC.match(rfc3339(1795705741.5))


def test_log_lines_carry_rfc3339_utc_timestamps(tmp_path: Path) -> None:
    done = subprocess.run([str(SANDFORGE), "-vv", "exec", program(tmp_path, "return 1\n")], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stamps = [ln.split(" ", 1)[0] for ln in done.stderr.splitlines() if " DEBUG " in ln or " INFO " in ln]
    assert stamps and all(RFC3339_UTC.match(s) for s in stamps), done.stderr[:2000]


def test_sessions_json_times_are_rfc3339(tmp_path: Path) -> None:
    from sandforge.runtime.sessions import SessionStore

    store = SessionStore(tmp_path / "sessions.db")
    store.create_session(title="hello")
    store.close()
    result = invoke("sessions", "list", "--state-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    [session] = json.loads(result.stdout)
    assert RFC3339_UTC.match(session["created_at"]) and RFC3339_UTC.match(session["updated_at"])


def test_progress_is_plain_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with Steps("work") as steps:
        steps.step("first")
        steps.step("second")
    assert capsys.readouterr().err == "  first\n  second\n"
    with Steps("work", quiet=True) as steps:
        steps.step("hidden")
    assert capsys.readouterr().err == ""


def test_demo_json_is_one_object_on_stdout_and_the_story_on_stderr(tmp_path: Path) -> None:
    result = invoke("demo", "--json", "--log", str(tmp_path / "calls.jsonl"))
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert [c["method"] for c in summary["calls"]] == ["add", "multiply", "divide", "mean"]
    assert summary["calls"][0]["attempts"] == 2 and summary["calls"][2]["status"] == "error"
    assert summary["records"] >= 4 and "guardrail" in result.stderr


class _Terminal:
    """A standard error that says it is a terminal (rich then draws its spinner)."""

    def __init__(self) -> None:
        import io

        self.buffer = io.StringIO()

    def write(self, text: str) -> int:
        return self.buffer.write(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no descriptor")


@pytest.mark.parametrize("no_color", [True, False])
def test_progress_on_a_terminal_honours_no_color(monkeypatch: pytest.MonkeyPatch, no_color: bool) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    with Steps("build") as steps:
        steps.step("debootstrap")
    text = terminal.buffer.getvalue()
    assert "debootstrap" in text
    colours = re.findall(r"\x1b\[[0-9;]*[1-9][0-9;]*m", text)  # SGR sequences other than a plain reset
    assert (colours == []) is no_color, colours


def test_shell_completion_lists_commands() -> None:
    result = CliRunner().invoke(main, [], prog_name="sandforge", env={
        "_SANDFORGE_COMPLETE": "bash_complete", "COMP_WORDS": "sandforge ex", "COMP_CWORD": "1"})  # fmt: skip
    assert result.exit_code == 0 and "plain,exec" in result.output
