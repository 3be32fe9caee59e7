"""The MCP clients people use, against `sandforge mcp` (stdio) and `/mcp` on `sandforge serve` (streamable HTTP):
the official TypeScript SDK client (``@modelcontextprotocol/sdk`` 1.x) and MCP Inspector's CLI mode, both from
npm (pinned by ``tests/mcp_clients/package-lock.json``, installed by ``.ci/npm-clients``), on Node.

Through the TypeScript SDK client every tool is called, for its success and for every error lane (a guardrail
refusal with its fix, a timeout, the program's ``Outcome.error``, an execution error, a sandbox violation, the
server's own refusals), and each result must be one the client accepts: the TypeScript SDK 1.x validates
``structuredContent`` against the tool's ``outputSchema`` even on ``isError`` results and throws ``-32602``
otherwise (docs/serve.md, "Errors"). The Inspector's CLI starts a new client (and over stdio a new
``sandforge mcp``) per call, minutes for the whole list under load, and checks results with the same SDK: it
lists the tools and makes one call of each result shape per transport (a success with structured content, an
``isError`` result), which is what proves the Inspector accepts what the server answers.
Skips without node or the installed clients; fails instead under ``SANDFORGE_REQUIRE_NODE=1`` (CI).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.service.mcp.conftest import sandforge_command
from tests.service.mcp.test_stdio import FIXED
from tests.service.serverproc import Server, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "tests" / "mcp_clients"
REQUIRE_NODE = os.environ.get("SANDFORGE_REQUIRE_NODE") == "1"


@dataclass(frozen=True)
class Case:
    """One tools/call and what it must answer: ``error`` None for a success, else its error_type and lane
    and words its text must hold."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None
    lane: str | None = None
    says: tuple[str, ...] = ()


CASES = [
    Case("list_tools", {}),
    Case("validate_code", {"code": "import os\nreturn os.getcwd()"}),
    Case("get_tool", {"role": "calculator", "method": "add"}),
    Case("explain_policy", {"name": "forbidden_module"}),
    Case("run_tool_code", {"code": "context['n'] = sum(args)\nreturn 'ok'", "args": [1, 2]}),
    Case("call_stored_tool", {"role": "calculator", "method": "add", "args": [2, 3]}),
    Case("calculator.add", {"args": [40, 2]}),
    Case("shouter.shout", {"args": ["mcp"]}),
    # every error lane
    Case("run_tool_code", {"code": "import os\nreturn os.getcwd()"}, "guardrail_violation", "guardrail", ("fix (",)),
    Case("run_tool_code", {"code": "while True:\n    pass", "timeout_s": 1}, "timeout", "extrinsic"),
    Case("run_tool_code", {"code": "return Outcome.error('no_stock', 'gone')"}, "tool_error", "outcome", ("no_stock",)),
    Case("run_tool_code", {"code": "return 1 / 0"}, "execution", "execution", ("ZeroDivisionError",)),
    Case(
        "run_tool_code",
        {"code": "import functools\nreturn hasattr(functools, 'singledispatch')"},
        "sandbox_violation",
        "execution",
        ("withheld",),
    ),  # the policy approves it; the inner wall refuses it
    Case("run_tool_code", {"code": "return 1", "timeout_s": 10_000}, "limit_exceeded", "request"),
    Case("validate_code", {"code": 7}, "invalid_request", "request"),
    Case("get_tool", {"role": "nobody"}, "tool_not_found", "request"),
    Case("explain_policy", {"name": "nonsense"}, "unknown_rule", "request"),
    Case("call_stored_tool", {"role": "nobody", "method": "run"}, "provider", "extrinsic"),
    Case("calculator.add", {"argz": [1]}, "invalid_request", "request"),
    Case("nobody.nothing", {}, "unknown_tool", "request"),
]
#: The Inspector's calls: one of each result shape (the SDK client above covers every tool and lane).
INSPECTOR_CASES = [c for c in CASES if c.name == "run_tool_code" and c.error in (None, "guardrail_violation")]


def clients_home() -> Path:
    """Where .ci/npm-clients installed the clients; skips (fails under SANDFORGE_REQUIRE_NODE=1) without them."""
    home = Path(os.environ.get("SANDFORGE_MCP_CLIENTS", Path.home() / ".cache" / "sandforge" / "mcp-clients"))
    problem = None
    if shutil.which("node") is None:
        problem = "node is not installed"
    elif not (home / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        problem = f"the MCP clients are not installed in {home} (run .ci/npm-clients)"
    elif (home / "package-lock.json").read_bytes() != (SCRIPTS / "package-lock.json").read_bytes():
        problem = f"the MCP clients in {home} are not the pinned ones (run .ci/npm-clients)"
    if problem is not None:
        if REQUIRE_NODE:
            pytest.fail(f"MCP clients required (SANDFORGE_REQUIRE_NODE=1): {problem}")
        pytest.skip(problem)
    return home


def drive(script: str, target: dict[str, Any], cases: list[Case]) -> dict[str, Any]:
    """Run one client script with the plan on stdin; its JSON answer."""
    plan = {"target": target, "calls": [{"name": c.name, "arguments": c.arguments} for c in cases]}
    env = {**os.environ, "SANDFORGE_MCP_CLIENTS": str(clients_home())}
    done = subprocess.run(["node", str(SCRIPTS / script)], input=json.dumps(plan), capture_output=True, text=True,
                          env=env, timeout=540, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def stdio_target(state: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "SANDFORGE_MCP_PROVIDER")}
    args = ["mcp", "--state-dir", str(state), "--backend", "subprocess", "--provider", "none", "--timeout", "5"]
    return {"command": sandforge_command(), "args": args, "env": env}


def check(case: Case, result: dict[str, Any]) -> None:
    """A result the client accepted, as ``case`` expects: a success with structured content (the client checked
    it against the output schema), or an isError result with its error, fix and lane in text and no
    structured content."""
    where = f"{case.name} {case.arguments}"
    if case.error is None:
        assert not result.get("isError"), (where, result)
        assert isinstance(result.get("structuredContent"), dict), (where, result)
        return
    assert result.get("isError") is True, (where, result)
    assert "structuredContent" not in result, (where, result)
    text, envelope = (block["text"] for block in result["content"])
    failure = json.loads(envelope)
    assert failure["error_type"] == case.error, (where, text)
    assert text.startswith(f"{case.error}: ") and f"\nlane: {case.lane} (" in text, (where, text)
    for words in case.says:
        assert words in text, (where, words, text)
    assert "Traceback" not in text


def check_tools(tools: list[dict[str, Any]]) -> None:
    names = {t["name"] for t in tools}
    assert names == FIXED | {"calculator.add", "shouter.shout"}, names
    for tool in tools:  # no docstring indentation reaches a client
        assert "\n " not in (tool.get("description") or ""), tool["name"]


def check_sdk(answer: dict[str, Any]) -> None:
    thrown = [(r["name"], r["error"]) for r in answer["results"] if not r["ok"]]
    assert thrown == [], thrown  # e.g. -32602 "Structured content does not match the tool's output schema"
    check_tools(answer["tools"])
    for case, outcome in zip(CASES, answer["results"], strict=True):
        check(case, outcome["result"])
    assert answer["server"]["name"] == "sandforge" and answer["server"]["version"], answer["server"]
    assert set(answer["capabilities"]) >= {"tools"}
    assert "resources" in answer["capabilities"]  # sandforge://roles/{role}/context (a template)
    assert "prompts" not in answer["capabilities"]


def check_inspector(answer: dict[str, Any]) -> None:
    assert answer["tools"] is not None, answer["list"]
    check_tools(answer["tools"])
    for case, outcome in zip(INSPECTOR_CASES, answer["results"], strict=True):
        assert outcome["exit"] == 0 and outcome["result"] is not None, (case, outcome["output"])
        check(case, outcome["result"])


@pytest.fixture(scope="module")
def server(seeded_state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    clients_home()
    root = tmp_path_factory.mktemp("serve-real-clients")
    shutil.copytree(seeded_state, root / "alpha")
    tenant = {"name": "alpha", "state_dir": "alpha", "quotas": {"max_timeout_s": 5}}
    config = {"state_dir": "state", "tenants": [tenant]}
    srv = start_server(root, config)
    yield srv
    srv.stop()


def http_target(server: Server) -> dict[str, Any]:
    return {"url": f"{server.url}/mcp", "headers": {"Authorization": f"Bearer {server.tokens['alpha']}"}}


def test_typescript_sdk_over_stdio(tenant_a: Path) -> None:
    check_sdk(drive("sdk_client.mjs", stdio_target(tenant_a), CASES))


def test_typescript_sdk_over_http(server: Server) -> None:
    check_sdk(drive("sdk_client.mjs", http_target(server), CASES))


def test_inspector_cli_over_stdio(tenant_a: Path) -> None:
    check_inspector(drive("inspector_cli.mjs", stdio_target(tenant_a), INSPECTOR_CASES))


def test_inspector_cli_over_http(server: Server) -> None:
    check_inspector(drive("inspector_cli.mjs", http_target(server), INSPECTOR_CASES))


def _png_1x1() -> bytes:
    """A valid 1x1 RGB PNG, built by hand (signature, IHDR, IDAT, IEND with their CRCs): no image library."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0\xff\0\0")  # one scanline: filter 0, one red pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def test_typescript_sdk_receives_a_png_output_as_an_image_item(tenant_a: Path) -> None:
    png = _png_1x1()
    program = f"with open('outputs/dot.png', 'wb') as f:\n    f.write({png!r})\nreturn 'drawn'"
    answer = drive("sdk_client.mjs", stdio_target(tenant_a), [Case("run_tool_code", {"code": program})])
    (outcome,) = answer["results"]
    assert outcome["ok"], outcome  # the client accepted the result (its schema check included)
    result = outcome["result"]
    assert not result.get("isError") and result["structuredContent"]["files"][0]["name"] == "dot.png", result
    images = [item for item in result["content"] if item["type"] == "image"]
    assert len(images) == 1 and images[0]["mimeType"] == "image/png", result["content"]
    assert base64.b64decode(images[0]["data"]) == png
