"""Hostile input at every entry point (issue 14 item 4): one `error:` line, exit 2, bounded time and memory,
nothing read from a device or a FIFO, nothing run, nothing written."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from sandforge.runtime.errors import InputFileError
from sandforge.runtime.files import decode_json

COUNTER = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"
DEEP_LIST = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


def run(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def one_line_error(result: Result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    path = tmp_path / "counter.py"
    path.write_text(COUNTER)
    return path


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


# --- the context file --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (DEEP_LIST, "recursion limit"),
        (DEEP_OBJECT, "recursion limit"),
        (b'{"n": ' + b"7" * 5000 + b"}", "number out of range"),
        (b'{"n": 1e400}', "overflows to infinity"),
        (b'{"n": [1, 2, -1E+999]}', "overflows to infinity"),
        (b'{"n": NaN}', "not valid JSON"),
        (b'{"n": Infinity}', "not valid JSON"),
        (b'{"n": "\xff\xfe"}', "not valid JSON"),
        (b'{"n": "\\ud800"}', "not valid JSON"),
        (b"\xff\xfe{\x00}\x00", "UTF-16/32 byte-order mark"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{" * 3, "not valid JSON"),
    ],
)
def test_hostile_context_files(tmp_path: Path, counter: Path, content: bytes, needle: str) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_bytes(content)
    result = run("exec", str(counter), "--context", str(ctx), "--commit")
    assert needle in one_line_error(result)
    assert ctx.read_bytes() == content


def test_a_utf8_bom_is_skipped(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_bytes(b'\xef\xbb\xbf{"n": 4}')
    result = run("exec", str(counter), "--context", str(ctx), "--commit")
    assert result.exit_code == 0, result.output
    assert json.loads(ctx.read_text()) == {"n": 5}


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_are_refused_as_program_and_context(tmp_path: Path, counter: Path, device: str) -> None:
    assert "character device" in one_line_error(run("exec", device))
    assert "character device" in one_line_error(run("exec", str(counter), "--context", device))
    link = tmp_path / "ctx.json"
    link.symlink_to(device)
    assert "character device" in one_line_error(run("exec", str(counter), "--context", str(link), "--commit"))
    assert link.is_symlink()


def test_a_fifo_is_refused_without_blocking(counter: Path, fifo: Path) -> None:
    assert "FIFO" in one_line_error(run("exec", str(fifo)))
    assert "FIFO" in one_line_error(run("exec", str(counter), "--context", str(fifo), "--commit"))


def test_an_oversized_context_is_refused_before_it_is_read(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "ctx.json"
    with ctx.open("wb") as fh:  # sparse: 33 MiB long, nothing on disk
        fh.truncate(33 * 1024 * 1024)
    assert "over the limit" in one_line_error(run("exec", str(counter), "--context", str(ctx)))


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--args", "[" * 100_000, "recursion limit"),
        ("--args", "[1e400]", "overflows"),
        ("--args", "[" + "9" * 5000 + "]", "out of range"),
        ("--kwargs", '{"a": NaN}', "not valid JSON"),
        ("--kwargs", "[]", "must be a JSON object"),
    ],
)
def test_hostile_arguments(counter: Path, flag: str, value: str, needle: str) -> None:
    assert needle in one_line_error(run("exec", str(counter), flag, value))


def test_decode_json_is_strict_and_one_line() -> None:
    assert decode_json(b'\xef\xbb\xbf{"a": [1.5, "x"]}', what="t") == {"a": [1.5, "x"]}
    assert decode_json(b'{"e": "1e400 in a string is text"}', what="t") == {"e": "1e400 in a string is text"}
    for bad in (DEEP_LIST, b"1e999", b"\x00", b"", b'"\\udc00"', b"[1,]"):
        with pytest.raises(InputFileError) as info:
            decode_json(bad, what="t")
        assert "\n" not in str(info.value)


# --- other entry points ------------------------------------------------------------------------------


def test_policy_check_refuses_devices_and_fifos(fifo: Path) -> None:
    assert "character device" in one_line_error(run("policy", "check", "/dev/zero"))
    assert "FIFO" in one_line_error(run("policy", "check", str(fifo)))


def test_policy_check_bounds_stdin() -> None:
    result = run("policy", "check", "-", stdin=b"x = 1\n" * (3 * 1024 * 1024))
    assert "over the limit" in one_line_error(result)


def test_a_fifo_inside_a_policy_directory_is_refused(tmp_path: Path, counter: Path) -> None:
    layer = tmp_path / "policy"
    layer.mkdir()
    os.mkfifo(layer / "rules.yaml")
    assert "FIFO" in one_line_error(run("policy", "check", str(counter), "--policy", str(layer)))
    assert "neither a regular file nor a directory" in one_line_error(
        run("policy", "list", "--policy", "/dev/zero")
    )


def test_a_deep_yaml_policy_file_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("rules: " + "[" * 100_000 + "]" * 100_000)
    one_line_error(run("policy", "list", "--policy", str(deep)))


@pytest.mark.parametrize("option", ["--scripted", "--groups", "--programs"])
def test_chat_inputs_refuse_devices_fifos_and_bombs(tmp_path: Path, fifo: Path, option: str) -> None:
    state = ["--state-dir", str(tmp_path / "state"), "--no-tool-store"]
    if option != "--scripted":  # a script, so that no model (API key) is needed to reach the option's file
        script = tmp_path / "script.json"
        script.write_text('{"turns": []}')
        state += ["--scripted", str(script)]
    assert "character device" in one_line_error(run("chat", option, "/dev/zero", *state))
    assert "FIFO" in one_line_error(run("chat", option, str(fifo), *state))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    ))  # fmt: skip
    deep = tmp_path / "deep.json"
    deep.write_bytes(DEEP_LIST)
    if option != "--programs":  # a program script is JSON or plain text, never YAML
        one_line_error(run("chat", option, str(bomb), *state))
    one_line_error(run("chat", option, str(deep), *state))


def test_logs_refuse_devices_and_fifos_and_skip_overlong_lines(tmp_path: Path, fifo: Path) -> None:
    assert "character device" in one_line_error(run("logs", "--file", "/dev/zero"))
    assert "FIFO" in one_line_error(run("logs", "--file", str(fifo)))
    log = tmp_path / "calls.jsonl"
    log.write_bytes(b"x" * (5 * 1024 * 1024) + b"\n" + DEEP_LIST + b"\n\xff\xfe\n")
    result = run("logs", "--file", str(log))
    assert result.exit_code == 0 and "3 unreadable lines skipped" in result.stderr


def test_a_session_database_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "sessions.db")
    assert "FIFO" in one_line_error(run("sessions", "list", "--state-dir", str(state)), code=1)
    (state / "sessions.db").unlink()
    (state / "sessions.db").symlink_to("/dev/zero")
    assert "character device" in one_line_error(run("sessions", "list", "--state-dir", str(state)), code=1)


def test_a_garbage_session_database_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "sessions.db").write_bytes(os.urandom(8192))
    one_line_error(run("sessions", "list", "--state-dir", str(state)), code=1)


def test_session_database_files_are_private(tmp_path: Path) -> None:
    from sandforge.runtime.sessions import SessionStore

    state = tmp_path / "state"
    with SessionStore(state=state) as store:
        store.create_session(title="secret")
        names = {p.name: oct(p.stat().st_mode & 0o777) for p in state.iterdir()}
    assert names == {"sessions.db": "0o600", "sessions.db-wal": "0o600", "sessions.db-shm": "0o600"}
    assert oct(state.stat().st_mode & 0o777) == "0o700"


def test_an_existing_world_readable_session_database_is_made_private(tmp_path: Path) -> None:
    from sandforge.runtime.sessions import SessionStore

    path = tmp_path / "old.db"
    sqlite3.connect(path).close()
    path.chmod(0o644)
    with SessionStore(path):
        pass
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_hostile_rows_in_a_session_database_are_read_without_a_traceback(tmp_path: Path) -> None:
    from sandforge.runtime.sessions import SessionStore

    state = tmp_path / "state"
    with SessionStore(state=state) as store:
        session_id = store.create_session(title="t").id
    deep = "[" * 100_000 + "]" * 100_000
    conn = sqlite3.connect(state / "sessions.db")
    with conn:
        conn.execute(
            "INSERT INTO messages (session_id, type, content, tool_name, tool_call_id, tool_status, tool_input,"
            " created_at, metadata) VALUES (?, 'tool_call', ?, 'load_tool_group', 'x', 'success', ?, 0, ?)",
            (session_id, "caf\u00e9 \u2603", deep, '{"n": ' + "9" * 5000 + "}"),
        )
    conn.close()
    for args in (["sessions", "show", session_id, "--json"], ["sessions", "show", session_id], ["sessions", "list"]):
        result = run(*args, "--state-dir", str(state))
        assert result.exit_code == 0, (args, result.output, result.exception)
        assert "Traceback" not in result.output
