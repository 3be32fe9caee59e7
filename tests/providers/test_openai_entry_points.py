"""The openai provider wherever a provider is named, against an OpenAI-compatible server on loopback:
``sandforge chat --provider openai --base-url``, ``sandforge mcp --provider openai`` and a ``serve`` tenant.

Each runs as its own process, with the key only in its environment; the test then greps everything those
processes wrote (standard output and error with OpenTelemetry's console spans and the SDK's debug log, the state
directory: call log, sessions database, tool store, audit log, the recording) for the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.providers.wire import Reply, Seen, WireServer, completion, function_call, program_completion, wire_server

KEY = "sk-proj-" + secrets.token_hex(24)
PROGRAM = "return kwargs.get('x', 0) + 1\n"
GROUPS = [{"name": "calc", "description": "Adds one.", "role": "calc",
           "tools": [{"name": "calc_add", "description": "Add one to x.", "method": "add",
                      "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}]}]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "SANDFORGE_OPENAI_"))}
    env.pop("SANDFORGE_MCP_PROVIDER", None)
    env.pop("SANDFORGE_CALL_LOG", None)  # tests/conftest.py's run-wide log: here each command's own is read
    return {**env, "OPENAI_API_KEY": KEY, "OPENAI_LOG": "debug", **extra}


def model_server(server: WireServer) -> WireServer:
    """Program requests (they offer ``submit_program``) get PROGRAM; chat requests, in order: load the group,
    call its tool, answer."""
    chat_turns = [
        completion(tool_calls=[function_call("load_tool_group", {"group_name": "calc"}, "call_load")]),
        completion(tool_calls=[function_call("calc_add", {"x": 2}, "call_add")]),
        completion(content="The answer is 3."),
    ]

    def handler(seen: Seen) -> Reply:
        if "submit_program" in seen.tool_names:
            return Reply(body=program_completion(PROGRAM))
        chats = sum(1 for r in server.requests if "submit_program" not in r.tool_names)
        return Reply(body=chat_turns[min(chats, len(chat_turns)) - 1])

    server.handler = handler
    return server


@pytest.fixture
def server() -> Iterator[WireServer]:
    with wire_server() as s:
        yield model_server(s)


def everything_written(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


def assert_no_key(texts: dict[str, bytes]) -> None:
    leaked = [name for name, data in texts.items() if KEY.encode() in data or KEY[-16:].encode() in data]
    assert leaked == [], f"the key is in {leaked}"


def assert_key_was_sent(server: WireServer) -> None:
    assert server.requests and {r.headers["authorization"] for r in server.requests} == {f"Bearer {KEY}"}


def test_chat_with_provider_openai(tmp_path: Path, server: WireServer) -> None:
    (tmp_path / "groups.json").write_text(json.dumps(GROUPS))
    state = tmp_path / "state"
    args = [sys.executable, "-m", "sandforge", "chat", "--provider", "openai", "--base-url", f"{server.url}/v1",
            "--model", "local-model", "--state-dir", str(state), "--groups", str(tmp_path / "groups.json"),
            "--backend", "subprocess", "--record", str(state / "session.jsonl")]  # fmt: skip
    env = _env(SANDFORGE_OTEL="1", OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
               SANDFORGE_OTEL_RECORD_IO="1")  # fmt: skip
    done = subprocess.run(args, input="add one to 2\n/exit\n", capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "assistant> The answer is 3." in done.stdout
    assert "[calc_add(" in done.stderr and "-> success]" in done.stderr
    assert '"name": "sandforge.' in done.stdout  # the console exporter printed spans
    assert_key_was_sent(server)
    programs = [r for r in server.requests if "submit_program" in r.tool_names]
    assert len(programs) == 1 and programs[0].body["model"] == "local-model"
    calls = [json.loads(line) for line in (state / "logs" / "calls.jsonl").read_text().splitlines()]
    assert [(c["role"], c["method"], c["value"], c["provider"]) for c in calls] == [("calc", "add", 3, "openai")]
    recorded = [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]
    assert sorted(r["kind"] for r in recorded) == ["chat", "chat", "chat", "program"]
    assert_no_key({"stdout": done.stdout.encode(), "stderr": done.stderr.encode(), **everything_written(state)})
    # the transcript went out as chat-completions messages: the assistant's tool_calls, then each result as a
    # `tool` message answering its call id
    last = [r for r in server.requests if "submit_program" not in r.tool_names][-1].body
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last["messages"][4]["tool_calls"][0]["function"] == {"name": "calc_add", "arguments": '{"x": 2}'}
    assert last["messages"][5]["tool_call_id"] == "call_add" and last["messages"][5]["content"] == "3"
    assert {t["function"]["name"] for t in last["tools"]} >= {"load_tool_group", "calc_add"}

    # the recording replays the whole chat, tool program included, with no model server and no key
    replayed, recording = tmp_path / "replayed", state / "session.jsonl"
    args = [sys.executable, "-m", "sandforge", "chat", "--provider", "replay", "--replay", str(recording),
            "--state-dir", str(replayed), "--groups", str(tmp_path / "groups.json"),
            "--backend", "subprocess"]  # fmt: skip
    seen = len(server.requests)
    again = subprocess.run(args, input="add one to 2\n/exit\n", capture_output=True, text=True,
                           env={k: v for k, v in _env().items() if k != "OPENAI_API_KEY"}, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "assistant> The answer is 3." in again.stdout and len(server.requests) == seen
    diverged = subprocess.run(args, input="add one to 5\n/exit\n", capture_output=True, text=True, env=_env(),
                              timeout=300)  # fmt: skip
    assert "error: replay session.jsonl: chat exchange 1 differs at messages[0].content[0].text" in diverged.stderr


def test_config_shows_the_openai_settings_but_never_the_key(tmp_path: Path) -> None:
    settings = f'openai_base_url = "http://127.0.0.1:8080/v1"\nopenai_api_key = "{KEY}"\n'
    (tmp_path / "sandforge.toml").write_text(settings)
    env = {k: v for k, v in _env().items() if not k.startswith("SANDFORGE_OPENAI")}
    done = subprocess.run([sys.executable, "-m", "sandforge", "config"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "openai_base_url" in done.stdout and "http://127.0.0.1:8080/v1  [file]" in done.stdout
    assert "openai_api_key" in done.stdout and "(set)  [file]" in done.stdout
    as_json = subprocess.run([sys.executable, "-m", "sandforge", "config", "--json"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert_no_key({"text": done.stdout.encode() + done.stderr.encode(), "json": as_json.stdout.encode()})


def test_mcp_with_provider_openai(tmp_path: Path, server: WireServer) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    state, errors = tmp_path / "state", tmp_path / "mcp.stderr"
    params = StdioServerParameters(  # the server's standard error (its log) kept in a file, to be grepped
        command="sh", env=_env(),
        args=["-c", f'exec "$0" "$@" 2>"{errors}"', sys.executable, "-m", "sandforge", "mcp", "--state-dir",
              str(state), "--backend", "subprocess", "--provider", "openai", "--base-url", f"{server.url}/v1",
              "--model", "local-model"],
    )  # fmt: skip
    result: dict[str, Any] = {}

    async def main() -> None:
        async with Client(params) as client:
            answer = await client.call_tool("call_stored_tool", {"role": "calc", "method": "add",
                                                                 "kwargs": {"x": 41}})  # fmt: skip
            result.update(answer.structured_content or {})

    asyncio.run(main())
    assert (result.get("status"), result.get("value")) == ("ok", 42), result
    assert_key_was_sent(server)
    assert_no_key({"stderr": errors.read_bytes(), **everything_written(state)})


def test_serve_tenant_with_provider_openai(tmp_path: Path, server: WireServer) -> None:
    from tests.service.serverproc import start_server

    config = {"state_dir": "state", "tenants": [
        {"name": "alpha", "provider": {"kind": "openai", "base_url": f"{server.url}/v1", "model": "local-model",
                                       "api_key_env": "ALPHA_MODEL_KEY", "max_retries": 0}}]}  # fmt: skip
    srv = start_server(tmp_path / "serve", config, env={"ALPHA_MODEL_KEY": KEY, "OPENAI_LOG": "debug"})
    try:
        with srv.client("alpha") as client:
            outcome = client.post("/v1/agents/calc/add", json={"kwargs": {"x": 9}}).json()
            calls = client.get("/v1/calls").text
    finally:
        srv.stop()
    assert (outcome["status"], outcome["value"]) == ("ok", 10), outcome
    assert_key_was_sent(server)
    written = everything_written(tmp_path / "serve")
    assert any(name.endswith("audit.jsonl") for name in written)
    assert_no_key({"outcome": json.dumps(outcome).encode(), "calls": calls.encode(), **written})


def test_demo_with_provider_openai_records_and_replays(tmp_path: Path) -> None:
    """``sandforge demo --provider openai``: the calculator walk-through on an OpenAI-compatible server, the
    key only in the environment; its recording then replays the demo with no server and no key."""
    from sandforge.runtime.cli.demo_cmd import DEMO_PROGRAMS

    state, recording = tmp_path / "state", tmp_path / "state" / "demo.jsonl"
    state.mkdir()
    with wire_server() as server:
        server.queue(*(Reply(body=program_completion(code)) for code in DEMO_PROGRAMS))
        args = [sys.executable, "-m", "sandforge", "demo", "--provider", "openai", "--base-url", f"{server.url}/v1",
                "--model", "local-model", "--log", str(state / "calls.jsonl"), "--record", str(recording)]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=300)
        assert done.returncode == 0, done.stderr
        assert_key_was_sent(server)
        assert len(server.requests) == len(DEMO_PROGRAMS)
        assert {r.body["model"] for r in server.requests} == {"local-model"}
    assert f"programs come from an OpenAI-compatible model at {server.url}/v1 (live)" in done.stdout
    assert "rejected by the guardrail before running" in done.stdout  # the first program imports os
    assert "calculator.multiply -> ok 15" in done.stdout and "└ statistician.mean([2, 4, 9]) -> ok 5" in done.stdout
    calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    assert {c["provider"] for c in calls} == {"openai"} and len(calls) == 5
    assert_no_key({"stdout": done.stdout.encode(), "stderr": done.stderr.encode(), **everything_written(state)})

    replay = [sys.executable, "-m", "sandforge", "demo", "--provider", "replay", "--replay", str(recording),
              "--log", str(tmp_path / "replayed.jsonl")]  # fmt: skip
    env = {k: v for k, v in _env().items() if k != "OPENAI_API_KEY"}
    again = subprocess.run(replay, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"programs come from the recording {recording} (replayed, no network)" in again.stdout
    assert "calculator.multiply -> ok 15" in again.stdout and "└ statistician.mean([2, 4, 9]) -> ok 5" in again.stdout


def test_demo_model_options_need_a_live_model() -> None:
    done = subprocess.run([sys.executable, "-m", "sandforge", "demo", "--model", "m"], capture_output=True, text=True,
                          env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == 2 and "the model options need --live or --provider" in done.stderr
    assert "Traceback" not in done.stderr
