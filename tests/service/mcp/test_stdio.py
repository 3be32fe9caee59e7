"""`sandforge mcp` over stdio, driven by the MCP SDK's own client: a real server process, real sandboxes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult

from tests.service.mcp.conftest import sandforge_command

FIXED = {"run_tool_code", "validate_code", "list_tools", "get_tool", "call_stored_tool", "explain_policy"}
READ_ONLY = {"validate_code", "list_tools", "get_tool", "explain_policy"}


def server(state: Path, *extra: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env.pop("SANDFORGE_MCP_PROVIDER", None)
    args = ["mcp", "--state-dir", str(state), "--backend", "subprocess", *extra]
    return StdioServerParameters(command=sandforge_command(), args=args, env=env)


def session(params: StdioServerParameters, body: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Client(params) as client:
            await body(client)

    asyncio.run(main())


def failure(result: CallToolResult) -> dict[str, Any]:
    """The typed failure of an isError result: no structured content (it would not match the tool's output
    schema), a text a model reads (the error, its lane) and the failure as JSON."""
    assert result.is_error, result
    assert result.structured_content is None, result
    text, envelope = (block.text for block in result.content)  # type: ignore[union-attr]
    data = json.loads(envelope)
    assert isinstance(data, dict), result
    assert text.startswith(data["error_type"] + ": ") and "\nlane: " in text, text
    assert "Traceback" not in text + envelope
    return data


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_fixed_and_persisted_tools_are_listed_with_schemas_and_annotations(tenant_a: Path) -> None:
    async def body(client: Client) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) >= FIXED
        for name in FIXED:
            tool = tools[name]
            assert tool.input_schema["type"] == "object" and tool.output_schema is not None, name
            assert tool.annotations is not None and tool.annotations.read_only_hint is (name in READ_ONLY)
            assert tool.annotations.open_world_hint is False  # the default policy grants no egress
        assert tools["run_tool_code"].input_schema["required"] == ["code"]
        # the proven stored methods are tools of their own, described by their contract
        add = tools["calculator.add"]
        assert "Add two numbers." in (add.description or "")
        assert add.output_schema is not None and add.output_schema["properties"]["value"] == {"type": "number"}
        assert set(add.input_schema["properties"]) == {"args", "kwargs"}
        assert "shouter.shout" in tools
        assert set(tools) == FIXED | {"calculator.add", "shouter.shout"}

    session(server(tenant_a, "--provider", "none"), body)


def test_tools_answer_and_persisted_methods_run_without_a_model(tenant_a: Path) -> None:
    async def body(client: Client) -> None:
        added = ok(await client.call_tool("calculator.add", {"args": [40, 2]}))
        assert added == {"status": "ok", "value": 42, "tool_role": "calculator", "method_name": "add",
                         "program_source": "persisted", "files": []}  # fmt: skip
        shout = ok(await client.call_tool("shouter.shout", {"args": ["mcp"]}))
        assert shout["value"] == "MCP!"
        ran = ok(await client.call_tool("run_tool_code", {"code": "context['n'] = args[0] * 2\nreturn 'ok'",
                                                          "args": [21], "context": {"n": 0}}))  # fmt: skip
        assert ran["value"] == "ok" and ran["context"] == {"n": 42} and ran["backend"] == "subprocess"
        report = ok(await client.call_tool("validate_code", {"code": "import os\nreturn os.getcwd()"}))
        assert report["verdict"] != "approved" and report["violations"][0]["rule"] == "forbidden_module"
        assert ok(await client.call_tool("validate_code", {"code": "return 1"}))["verdict"] == "approved"
        listed = ok(await client.call_tool("list_tools", {}))
        assert {t["role"] for t in listed["tools"]} == {"calculator", "shouter"}
        detail = ok(await client.call_tool("get_tool", {"role": "calculator", "method": "add"}))
        assert detail["code"] == "return args[0] + args[1]"
        assert detail["methods"][0]["health"] == "healthy" and detail["methods"][0]["mcp_tool"] == "calculator.add"
        called = ok(await client.call_tool("call_stored_tool", {"role": "calculator", "method": "add",
                                                                "args": [1, 1]}))  # fmt: skip
        assert called["value"] == 2 and called["program_source"] == "persisted"
        page = ok(await client.call_tool("explain_policy", {"name": "forbidden_module"}))
        assert page["page"].startswith("# forbidden_module")

    session(server(tenant_a, "--provider", "none"), body)


def test_typed_failures_are_error_results_with_their_type(tenant_a: Path) -> None:
    async def body(client: Client) -> None:
        refused = failure(await client.call_tool("run_tool_code", {"code": "import os\nreturn os.getcwd()"}))
        assert refused["error_type"] == "guardrail_violation" and refused["details"]["violations"]
        slow = failure(await client.call_tool("run_tool_code", {"code": "while True:\n    pass", "timeout_s": 1}))
        assert slow["error_type"] == "timeout" and slow["retriable"] is True
        raised = failure(await client.call_tool("run_tool_code", {"code": "return 1 / 0"}))
        assert raised["error_type"] == "execution" and raised["details"]["exception"] == "ZeroDivisionError"
        chosen = failure(await client.call_tool("run_tool_code", {"code": "return Outcome.error('no_stock', 'none')"}))
        assert chosen["error_type"] == "tool_error" and chosen["details"]["tool_error_type"] == "no_stock"
        big = failure(await client.call_tool("run_tool_code", {"code": "return 1", "timeout_s": 10_000}))
        assert big["error_type"] == "limit_exceeded"
        bad = failure(await client.call_tool("run_tool_code", {"code": 7}))
        assert bad["error_type"] == "invalid_request"
        extra = failure(await client.call_tool("calculator.add", {"argz": [1]}))
        assert extra["error_type"] == "invalid_request"
        assert failure(await client.call_tool("get_tool", {"role": "nobody"}))["error_type"] == "tool_not_found"
        assert failure(await client.call_tool("explain_policy", {"name": "nonsense"}))["error_type"] == "unknown_rule"
        assert failure(await client.call_tool("nobody.nothing", {}))["error_type"] == "unknown_tool"
        # nothing stored and no provider: the lifecycle's typed provider failure, nothing generated
        missing = failure(await client.call_tool("call_stored_tool", {"role": "nobody", "method": "run"}))
        assert missing["error_type"] == "provider"
        assert "/" not in missing["error_message"]  # no host path

    session(server(tenant_a, "--provider", "none", "--timeout", "5"), body)


def test_a_tool_forged_during_the_session_becomes_a_tool_of_its_own(tenant_a: Path, tmp_path: Path) -> None:
    programs = tmp_path / "programs.json"
    programs.write_text(json.dumps(["return 'hello ' + args[0]"]))

    async def body(client: Client) -> None:
        before = {t.name for t in (await client.list_tools()).tools}
        assert "greeter.hello" not in before
        forged = ok(await client.call_tool("call_stored_tool", {"role": "greeter", "method": "hello",
                                                                "args": ["Ann"]}))  # fmt: skip
        assert forged == {"status": "ok", "value": "hello Ann", "tool_role": "greeter", "method_name": "hello",
                          "program_source": "generated", "files": []}  # fmt: skip
        after = {t.name for t in (await client.list_tools()).tools}
        assert after == before | {"greeter.hello"}
        again = ok(await client.call_tool("greeter.hello", {"args": ["Bob"]}))
        assert again["value"] == "hello Bob" and again["program_source"] == "persisted"  # the script had one program

    session(server(tenant_a, "--provider", "scripted", "--programs", str(programs)), body)


def test_a_tenant_of_a_server_configuration_over_stdio(tenant_a: Path, tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f"tenants:\n  - name: alpha\n    state_dir: {tenant_a}\n    quotas: {{max_timeout_s: 2}}\n")
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    params = StdioServerParameters(
        command=sandforge_command(), args=["mcp", "--config", str(config), "--tenant", "alpha"], env=env
    )

    async def body(client: Client) -> None:
        assert "calculator.add" in {t.name for t in (await client.list_tools()).tools}
        assert ok(await client.call_tool("calculator.add", {"args": [2, 2]}))["value"] == 4
        over = failure(await client.call_tool("run_tool_code", {"code": "return 1", "timeout_s": 3}))
        assert over["error_type"] == "limit_exceeded"  # the tenant's quota, not the sandbox's default

    session(params, body)


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    import subprocess

    for args in (["--tenant", "alpha"], ["--provider", "scripted"], ["--config", str(tmp_path / "none.yaml"),
                                                                       "--tenant", "a"]):  # fmt: skip
        done = subprocess.run([sandforge_command(), "mcp", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
        assert done.stdout == ""
