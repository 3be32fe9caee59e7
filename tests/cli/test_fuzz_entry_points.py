"""Property: arbitrary bytes at any entry point give a documented exit code, a one-line error and never a
traceback (issue 14 item 4). The CLI runs in-process through its main group."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandforge.runtime.cli import main

REJECTED = "import os\nreturn 1\n"  # the default policy refuses it: nothing is ever executed

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    return st.sampled_from([data, data[: len(data) // 2], data + b"\xff", b"\xef\xbb\xbf" + data, data * 3])


SEEDS = [
    b"[" * 5000, b'{"a":' * 3000, b"9" * 5000, b"1e400", b"NaN", b"- - - - -\n" * 50,
    b"a: &a [1]\nb: [*a, *a]\n", b"!!python/object:os.system {}", b"\x00" * 100,
]  # fmt: skip

hostile_bytes = st.one_of(
    st.binary(max_size=512),
    json_values.map(lambda v: json.dumps(v).encode()).flatmap(_mutations),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(SEEDS),
)

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def check(result: Result, allowed: set[int], *, one_line_codes: frozenset[int] = frozenset({2, 7})) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in allowed, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    if result.exit_code in one_line_codes:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def with_file(data: bytes, name: str, body: Callable[[Path, Path], Result]) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        return body(Path(tmp), path)


def invoke(*args: str, stdin: bytes = b"") -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def _rejected_program(tmp: Path) -> str:
    program = tmp / "prog.py"
    program.write_text(REJECTED)
    return str(program)


@FUZZ
@given(hostile_bytes)
def test_exec_context_file(data: bytes) -> None:
    result = with_file(
        data, "ctx.json", lambda tmp, p: invoke("exec", _rejected_program(tmp), "--context", str(p), "--commit")
    )
    check(result, {2, 3, 4})


@FUZZ
@given(st.text(max_size=300), st.sampled_from(["--args", "--kwargs"]))
def test_exec_json_arguments(text: str, flag: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        check(invoke("exec", _rejected_program(Path(tmp)), flag, text), {2, 3, 4})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bytes)
def test_exec_program_file(data: bytes) -> None:
    result = with_file(data, "prog.py", lambda tmp, p: invoke("exec", str(p), "--timeout", "5"))
    check(result, {0, 1, 2, 3, 4, 5})


@FUZZ
@given(hostile_bytes)
def test_policy_check_program(data: bytes) -> None:
    check(with_file(data, "prog.py", lambda tmp, p: invoke("policy", "check", str(p))), {0, 2, 3, 4})
    check(invoke("policy", "check", "-", stdin=data), {0, 2, 3, 4})


@FUZZ
@given(hostile_bytes)
def test_policy_file(data: bytes) -> None:
    check(with_file(data, "layer.yaml", lambda tmp, p: invoke("policy", "list", "--policy", str(p))), {0, 2})


@FUZZ
@given(hostile_bytes, st.sampled_from(["script.json", "script.yaml"]))
def test_chat_script(data: bytes, name: str) -> None:
    def body(tmp: Path, path: Path) -> Result:
        return invoke("chat", "--scripted", str(path), "--state-dir", str(tmp / "s"), "--no-tool-store")

    result = with_file(data, name, body)
    check(result, {0, 1, 2}, one_line_codes=frozenset({2}))


@FUZZ
@given(hostile_bytes, st.sampled_from([("--groups", "g.yaml"), ("--groups", "g.json"), ("--programs", "p.json"),
                                       ("--programs", "p.txt")]))  # fmt: skip
def test_chat_group_and_program_files(data: bytes, option: tuple[str, str]) -> None:
    def body(tmp: Path, path: Path) -> Result:
        script = tmp / "script.json"
        script.write_text('{"turns": []}')
        return invoke("chat", "--scripted", str(script), option[0], str(path), "--state-dir", str(tmp / "s"),
                      "--no-tool-store")  # fmt: skip

    check(with_file(data, option[1], body), {0, 1, 2}, one_line_codes=frozenset({2}))


@FUZZ
@given(hostile_bytes)
def test_call_log(data: bytes) -> None:
    check(with_file(data, "calls.jsonl", lambda tmp, p: invoke("logs", "--file", str(p))), {0, 2})


@FUZZ
@given(hostile_bytes, st.sampled_from(["registry.sqlite", "registry.json", "patterns.json"]))
def test_store_files_read_back(data: bytes, name: str) -> None:
    def body(tmp: Path, path: Path) -> Result:
        tools = tmp / "state" / "tools"
        tools.mkdir(parents=True)
        path.rename(tools / name)
        first = invoke("tools", "--store", str(tmp / "state"), "list", "--json")
        check(first, {0})
        return invoke("tools", "--store", str(tmp / "state"), "patterns")

    check(with_file(data, name, body), {0})


@FUZZ
@given(hostile_bytes)
def test_session_database_read_back(data: bytes) -> None:
    def body(tmp: Path, path: Path) -> Result:
        state = tmp / "state"
        state.mkdir()
        path.rename(state / "sessions.db")
        return invoke("sessions", "list", "--state-dir", str(state))

    check(with_file(data, "sessions.db", body), {0, 1}, one_line_codes=frozenset({1, 2, 5}))


@FUZZ
@given(hostile_bytes, st.sampled_from(["manifest", "method"]))
def test_role_files_read_back(data: bytes, which: str) -> None:
    from sandforge.runtime.store import StorePaths

    def body(tmp: Path, path: Path) -> Result:
        paths = StorePaths(tmp / "state")
        target = paths.manifest("calc") if which == "manifest" else paths.method_file("calc", "add")
        target.parent.mkdir(parents=True)
        path.rename(target)
        for args in (["show", "calc"], ["show", "calc", "add"], ["history", "calc", "add"], ["list"]):
            check(invoke("tools", "--store", str(paths.state_dir), *args), {0, 1})
        return invoke("tools", "--store", str(paths.state_dir), "health", "--json")

    check(with_file(data, "f.json", body), {0})
