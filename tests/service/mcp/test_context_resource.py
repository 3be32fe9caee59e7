"""``sandforge://roles/{role}/context`` (issue 37, item 4): a role's committed context as an MCP resource, read
with the MCP SDK's own client from a real `sandforge mcp` that shares its state with every other process of the
tenant (the library workspace here, `serve` in production)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.providers import ScriptedProvider
from tests.service.mcp.test_stdio import ok, server, session

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"


async def read_json(client: Client, uri: str) -> object:
    result = await client.read_resource(uri)
    (content,) = result.contents
    assert content.mime_type == "application/json"
    return json.loads(content.text)  # type: ignore[union-attr]


def test_the_context_resource_reads_what_calls_and_other_processes_committed(tmp_path: Path) -> None:
    state = tmp_path / "tenant"
    with Workspace(provider=ScriptedProvider([]), sandbox="subprocess", log=False, state_dir=state) as ws:
        ws.set_context("notes", {"a": [1, "x"]})
    programs = tmp_path / "programs.json"
    programs.write_text(json.dumps([INCR]))

    async def body(client: Client) -> None:
        assert client.server_capabilities.resources is not None  # declared: there is a template to read
        templates = (await client.list_resource_templates()).resource_templates
        assert "sandforge://roles/{role}/context" in [t.uri_template for t in templates]
        assert await read_json(client, "sandforge://roles/notes/context") == {"a": [1, "x"]}
        assert await read_json(client, "sandforge://roles/counter/context") == {}
        for expected in (1, 2):
            called = ok(await client.call_tool("call_stored_tool", {"role": "counter", "method": "incr"}))
            assert called["value"] == expected, called
        assert await read_json(client, "sandforge://roles/counter/context") == {"n": 2}
        with pytest.raises(MCPError):
            await client.read_resource("sandforge://roles/-bad/context")

    session(server(state, "--provider", "scripted", "--programs", str(programs)), body)
    # the server is gone: what it committed is on disk, for the next process of this tenant
    with Workspace(provider=ScriptedProvider([]), sandbox="subprocess", log=False, state_dir=state) as ws:
        assert ws.context("counter") == {"n": 2}
