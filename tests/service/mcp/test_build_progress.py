"""Issue 39 item 3: a first build of a program's environment over MCP sends ``notifications/progress`` to a
request that carries a ``progressToken`` (the MCP SDK's own client, a real ``sandforge mcp`` process, the
environment built offline from the wheelhouse; and the official TypeScript client, when node and the pinned
clients are there); a cached environment sends none."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.environments.helpers import WHEELHOUSE_ALLOW, require_wheelhouse
from tests.service.mcp.conftest import sandforge_command
from tests.service.mcp.test_real_clients import SCRIPTS

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""


def _tenant_config(tmp_path: Path) -> Path:
    """One tenant whose policy allows the wheelhouse's distributions, offline; its ``server.yaml``."""
    house = require_wheelhouse()
    (tmp_path / "deps").mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "source": "offline", "wheelhouse": str(house)}
    (tmp_path / "deps" / "deps.yaml").write_text(yaml.safe_dump({"dependencies": section}))
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({"tenants": [{"name": "alpha", "state_dir": str(tmp_path / "state"),
                                                   "policy": ["deps"]}]}))  # fmt: skip
    return config


def test_a_first_environment_build_sends_progress_notifications(tmp_path: Path) -> None:
    config = _tenant_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    params = StdioServerParameters(
        command=sandforge_command(), args=["mcp", "--config", str(config), "--tenant", "alpha"], env=env
    )
    heard: list[list[tuple[float, float | None, str | None]]] = [[], []]

    async def main() -> list[object]:
        values = []
        async with Client(params) as client:
            for n, day in enumerate(("5 March 2024", "6 March 2024")):

                async def progress(value: float, total: float | None, message: str | None, n: int = n) -> None:
                    heard[n].append((value, total, message))

                result = await client.call_tool("run_tool_code", {"code": DATEUTIL, "args": [day]},
                                                progress_callback=progress)  # fmt: skip
                assert not result.is_error, result
                assert isinstance(result.structured_content, dict)
                values.append(result.structured_content["value"])
        return values

    assert asyncio.run(main()) == ["2024-03-05T00:00:00", "2024-03-06T00:00:00"]
    first, cached = heard
    messages = [message or "" for _, _, message in first]
    assert messages[0].startswith("resolving python-dateutil"), messages
    assert any(m.startswith("installing ") and "package(s) into environment" in m for m in messages), messages
    assert [value for value, _, _ in first] == sorted({value for value, _, _ in first})  # increasing
    assert cached == []
    assert json.dumps(first).find(str(tmp_path)) == -1  # no host path in what the client sees


def test_the_typescript_sdk_hears_the_same_progress(tmp_path: Path) -> None:
    """The official TypeScript client (``onprogress``, which sends a ``progressToken``): the same steps."""
    from tests.service.mcp.test_real_clients import clients_home

    clients_home()  # skips without node and the pinned clients (fails under SANDFORGE_REQUIRE_NODE=1)
    config = _tenant_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    target = {"command": sandforge_command(), "args": ["mcp", "--config", str(config), "--tenant", "alpha"], "env": env}
    calls = [{"name": "run_tool_code", "arguments": {"code": DATEUTIL, "args": [day]}, "progress": True}
             for day in ("5 March 2024", "6 March 2024")]  # fmt: skip
    plan = {"target": target, "calls": calls}
    done = subprocess.run(["node", str(SCRIPTS / "sdk_client.mjs")], input=json.dumps(plan), capture_output=True,
                          text=True, env={**env, "SANDFORGE_MCP_CLIENTS": str(clients_home())}, timeout=540,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, cached = json.loads(done.stdout)["results"]
    assert first["ok"] and first["result"]["structuredContent"]["value"] == "2024-03-05T00:00:00", first
    messages = [p.get("message", "") for p in first["progress"]]
    assert messages and messages[0].startswith("resolving python-dateutil"), messages
    assert any(m.startswith("installing ") for m in messages), messages
    assert cached["ok"] and cached["progress"] == [], cached
