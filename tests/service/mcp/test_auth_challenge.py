"""A wrong token at ``/mcp`` of a real `sandforge serve`, as the clients people use meet it (docs/serve.md,
"Bearer tokens, not OAuth"): MCP Inspector's CLI fails at once with the service's ``unauthorized`` error, and an
OAuth-capable host (the TypeScript SDK with an OAuth provider, as Inspector's web UI and IDEs run it) ends its
discovery with an OAuth error saying how to authenticate, without sending anyone to an authorization page."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.mcp.test_real_clients import SCRIPTS, clients_home
from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("serve-auth"), {"state_dir": "state", "tenants": [{"name": "t"}]})
    yield srv
    srv.stop()


def _node(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDFORGE_MCP_CLIENTS": str(clients_home())}
    return subprocess.run(["node", *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_inspector_cli_fails_with_the_auth_error(server: Server) -> None:
    inspector = clients_home() / "node_modules" / "@modelcontextprotocol" / "inspector" / "cli" / "build" / "cli.js"
    done = _node(str(inspector), "--cli", f"{server.url}/mcp", "--transport", "http",
                 "--header", "Authorization: Bearer sf_wrong", "--method", "tools/list")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert '"type": "unauthorized"' in done.stderr and "a valid bearer token is required" in done.stderr, done.stderr


@pytest.mark.parametrize("token", ["sf_wrong", ""])
def test_an_oauth_host_is_told_to_send_a_bearer_token(server: Server, token: str) -> None:
    done = _node(str(Path(SCRIPTS) / "oauth_client.mjs"), f"{server.url}/mcp", token)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["redirected"] is None  # nobody is sent to an authorization page that cannot exist
    assert "no OAuth authorization server" in answer["error"] and "sandforge tokens create" in answer["error"]
    assert answer["requests"][0] == "POST /mcp 401"
    assert all(r.endswith(" 404") for r in answer["requests"][1:]), answer["requests"]
