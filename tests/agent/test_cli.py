"""`sandforge logs` and `sandforge demo`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.agent import CallLog, Workspace, read_records
from sandforge.runtime.cli import main
from sandforge.runtime.cli.logs_cmd import follow_lines
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import SandboxConfig
from tests.agent.conftest import RECOVERABLE


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    programs = [
        RECOVERABLE,
        "context['m'] = args[0]\nreturn args[0]\n",
        "return Outcome.error('bad_input', 'nope', retriable=False)\n",
        "r = tool('stats').mean(args[0])\nreturn r.value\n",
        "return sum(args[0]) / len(args[0])\n",
    ]
    with Workspace(provider=ScriptedProvider(programs), sandbox=SandboxConfig(pool_size=0), log=CallLog(path)) as ws:
        ws.call("calc", "set", 4)
        ws.call("calc", "fail")
        ws.call("calc", "mean", [1, 2, 3])
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_logs_prints_each_call_readably(log_file: Path) -> None:
    code, out = run("logs", "--file", str(log_file))
    assert code == 0, out
    lines = out.splitlines()
    assert any("calc.set(4) -> ok 4" in line and "2 attempts" in line for line in lines)
    assert any("attempt 1 failed in validation: forbidden_module" in line for line in lines)
    assert any("calc.fail() -> error [bad_input] nope" in line for line in lines)
    mean = next(i for i, line in enumerate(lines) if "calc.mean([1, 2, 3])" in line)
    assert "└ stats.mean([1, 2, 3]) -> ok 2" in lines[mean + 1]  # nested call right under its parent


def test_logs_filters(log_file: Path) -> None:
    _, out = run("logs", "--file", str(log_file), "--status", "error", "--brief")
    assert out.count("\n") == 1 and "calc.fail()" in out
    _, out = run("logs", "--file", str(log_file), "--role", "stats", "--brief")
    assert out.count("\n") == 1 and "stats.mean" in out
    trace = next(r.trace_id for r in read_records(log_file) if r.method == "mean")
    _, out = run("logs", "--file", str(log_file), "--trace", trace[:6], "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert {r["role"] for r in records} == {"calc", "stats"} and all(r["trace_id"] == trace for r in records)
    _, out = run("logs", "--file", str(log_file), "--last", "1", "--brief")
    assert out.count("\n") == 1 and "calc.mean" in out


def test_logs_skips_garbage_and_reports_it(log_file: Path) -> None:
    with log_file.open("a") as fh:
        fh.write("not json\n{}\n")
    result = CliRunner().invoke(main, ["logs", "--file", str(log_file), "--brief"])
    assert result.exit_code == 0
    assert "2 unreadable lines skipped" in result.output


def test_logs_without_a_file_is_a_usage_error(tmp_path: Path) -> None:
    code, out = run("logs", "--file", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no call log" in out


def test_logs_schema(tmp_path: Path) -> None:
    code, out = run("logs", "--schema")
    assert code == 0 and json.loads(out)["title"] == "CallRecord"


def test_follow_lines_sees_appended_records(tmp_path: Path) -> None:
    path = tmp_path / "grow.jsonl"
    path.write_text("old\n")
    done = threading.Event()
    seen: list[str] = []

    def reader() -> None:
        for line in follow_lines(path, poll_s=0.01, stop=done.is_set):
            seen.append(line)
            if len(seen) == 2:
                done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    with path.open("a") as fh:
        fh.write("first\nsec")
        fh.flush()
        time.sleep(0.05)
        fh.write("ond\n")
    thread.join(timeout=5)
    done.set()
    assert seen == ["first", "second"]


def test_logs_follow_in_a_real_process(log_file: Path) -> None:
    exe = Path(sys.executable).with_name("sandforge")
    proc = subprocess.Popen(
        [str(exe), "logs", "--follow", "--brief", "--file", str(log_file), "--role", "late"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        time.sleep(1.0)
        with Workspace(provider=ScriptedProvider(["return 'hi'\n"]), sandbox=SandboxConfig(pool_size=0),
                       log=CallLog(log_file)) as ws:  # fmt: skip
            ws.call("late", "greet")
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert 'late.greet() -> ok "hi"' in line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_demo_runs_the_whole_story(tmp_path: Path) -> None:
    log = tmp_path / "demo.jsonl"
    code, out = run("demo", "--log", str(log))
    assert code == 0, out
    assert "rejected by the guardrail before running: forbidden_module" in out
    assert "raised while running: KeyError" in out
    assert "rollback check: 'history', written only by the failed attempt, is in context: False" in out
    assert "-> 15: read from context, no model call" in out
    assert "calculator.divide -> error [division_by_zero] cannot divide by zero" in out
    assert "└ statistician.mean([2, 4, 9]) -> ok 5" in out
    assert 'context now: {"memory": 15, "last_mean": 5}' in out
    records = list(read_records(log))
    assert len(records) == 5
    assert [r.attempts for r in records if r.depth == 0] == [2, 2, 1, 1]


def test_demo_live_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, out = run("demo", "--live")
    assert code == 2 and "ANTHROPIC_API_KEY" in out


LIVE_PROGRAMS = {
    "calculator.add(5)": "context['memory'] = context.get('memory', 0) + args[0]\nreturn context['memory']\n",
    "calculator.multiply(3)": "context['memory'] = context.get('memory', 0) * args[0]\nreturn context['memory']\n",
    "calculator.divide(0)": "return Outcome.error('division_by_zero', 'cannot divide by zero', retriable=False)\n",
    "calculator.mean([2, 4, 9])": "return tool('statistician').mean(args[0]).value\n",
    "statistician.mean([2, 4, 9])": "return sum(args[0]) / len(args[0])\n",
}


def test_demo_live_talks_to_the_messages_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --live` end to end through the real SDK and HTTP, against a fake API on the loopback address."""
    import http.server

    seen: list[dict[str, object]] = []

    class FakeMessagesApi(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append(body)
            user = body["messages"][0]["content"]
            block = user.split('<untrusted_data source="call">', 1)[1].split("</untrusted_data>", 1)[0]
            call = json.loads(block)["call"]  # the call, as data (docs/security.md, "Prompt-rendering rule")
            program = {"type": "tool_use", "id": "toolu_1", "name": "submit_program",
                       "input": {"code": LIVE_PROGRAMS[call]}}  # fmt: skip
            reply = json.dumps({
                "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [program], "stop_reason": "tool_use", "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMessagesApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-local-test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}")
        code, out = run("demo", "--live", "--model", "claude-test-model")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, out
    assert "programs come from Claude (live)" in out
    assert "calculator.add -> ok 5" in out and "calculator.multiply -> ok 15" in out
    assert "calculator.mean -> ok 5" in out
    assert len(seen) == 5
    assert all(body["model"] == "claude-test-model" for body in seen)
    assert all(body["tool_choice"] == {"type": "tool", "name": "submit_program"} for body in seen)
