"""``GET``/``PUT /v1/roles/{role}/context`` on a real `sandforge serve` (issue 37, item 4): the context agent calls
commit, read and replaced under a strong ETag and If-Match, per tenant, kept across a restart."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.service.mcp.conftest import sandforge_command
from tests.service.mcp.test_context_resource import read_json
from tests.service.mcp.test_http import session as mcp_session
from tests.service.mcp.test_stdio import ok
from tests.service.mcp.test_stdio import session as stdio_session
from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"
CONFIG = {
    "state_dir": "state",
    "tenants": [
        {"name": "alpha", "provider": {"kind": "scripted", "programs": "programs.json"}},
        {"name": "beta", "provider": {"kind": "scripted", "programs": "programs.json"}},
        # a model that cannot be reached (its key is not set): its tools' state is still readable and settable
        {"name": "keyless", "provider": {"kind": "anthropic", "api_key_env": "SANDFORGE_TEST_UNSET_KEY"}},
    ],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("context")
    (root / "programs.json").write_text(json.dumps([INCR]))
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = start_server(root, CONFIG)
    yield srv
    srv.stop()


def _error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == error_type, body
    assert "\n" not in body["error"]["message"] and "Traceback" not in response.text


def test_a_context_is_read_and_replaced_under_its_etag(server: Server) -> None:
    with server.client("alpha") as client:
        first = client.get("/v1/roles/notes/context")
        assert first.status_code == 200 and first.json() == {}
        tag = first.headers["etag"]
        assert tag.startswith('"') and tag.endswith('"')  # strong: no W/
        _error(client.put("/v1/roles/notes/context", json={"a": 1}), 428, "precondition_required")
        put = client.put("/v1/roles/notes/context", json={"a": 1}, headers={"If-Match": tag})
        assert put.status_code == 200 and put.json() == {"a": 1}
        assert put.headers["etag"] != tag
        stale = client.put("/v1/roles/notes/context", json={"a": 2}, headers={"If-Match": tag})
        _error(stale, 412, "precondition_failed")
        assert stale.headers["etag"] == put.headers["etag"]  # the current one, to read again
        again = client.get("/v1/roles/notes/context")
        assert again.json() == {"a": 1} and again.headers["etag"] == put.headers["etag"]  # the 412 changed nothing
        forced = client.put("/v1/roles/notes/context", json={"b": [1, None]}, headers={"If-Match": "*"})
        assert forced.status_code == 200 and client.get("/v1/roles/notes/context").json() == {"b": [1, None]}
        # the tenant's data comes back as stored, paths included: a read then write never changes a value
        paths = {"report": "/tmp/reports/q1", "home": "/root/x", "state": str(Path(__file__).parent)}
        client.put("/v1/roles/notes/context", json=paths, headers={"If-Match": "*"})
        read = client.get("/v1/roles/notes/context")
        assert read.json() == paths
        client.put("/v1/roles/notes/context", json=read.json(), headers={"If-Match": read.headers["etag"]})
        assert client.get("/v1/roles/notes/context").json() == paths


def test_bad_bodies_and_names_get_one_line_typed_errors(server: Server) -> None:
    with server.client("alpha") as client:
        star = {"If-Match": "*"}
        _error(client.put("/v1/roles/notes/context", json=[1], headers=star), 422, "invalid_request")
        _error(client.put("/v1/roles/notes/context", json="x", headers=star), 422, "invalid_request")
        nan = client.put(
            "/v1/roles/notes/context", content=b'{"a": NaN}', headers={**star, "Content-Type": "application/json"}
        )
        assert nan.status_code in (400, 422) and nan.json()["error"]["type"] == "invalid_request", nan.text
        bad = client.put("/v1/roles/notes/context", content=b"{", headers={**star, "Content-Type": "application/json"})
        assert bad.status_code in (400, 422) and set(bad.json()) == {"error"}, bad.text
        _error(client.get("/v1/roles/no%20such/context"), 404, "not_found")
        _error(client.put("/v1/roles/-x/context", json={}, headers=star), 404, "not_found")


def test_agent_calls_commit_the_context_the_route_reads(server: Server) -> None:
    with server.client("alpha") as client:
        assert client.post("/v1/agents/counter/incr", json={}).json()["value"] == 1
        read = client.get("/v1/roles/counter/context")
        assert read.json() == {"n": 1}
        put = client.put("/v1/roles/counter/context", json={"n": 16}, headers={"If-Match": read.headers["etag"]})
        assert put.status_code == 200
        assert client.post("/v1/agents/counter/incr", json={}).json()["value"] == 17
        assert client.get("/v1/roles/counter/context").headers["etag"] != put.headers["etag"]  # a call commits too


def test_another_tenant_can_neither_read_nor_write_a_context(server: Server) -> None:
    with server.client("alpha") as a, server.client("beta") as b:
        tag = a.get("/v1/roles/secret/context").headers["etag"]
        assert a.put("/v1/roles/secret/context", json={"k": "alpha"}, headers={"If-Match": tag}).status_code == 200
        assert b.get("/v1/roles/secret/context").json() == {}  # beta's own role of that name: never written
        assert b.put("/v1/roles/secret/context", json={"k": "beta"}, headers={"If-Match": "*"}).status_code == 200
        assert a.get("/v1/roles/secret/context").json() == {"k": "alpha"}
        assert b.get("/v1/roles/secret/context").json() == {"k": "beta"}


def test_state_needs_no_provider(server: Server) -> None:
    with server.client("keyless") as client:
        assert client.get("/v1/roles/r/context").json() == {}
        assert client.put("/v1/roles/r/context", json={"a": 1}, headers={"If-Match": "*"}).json() == {"a": 1}
        assert client.post("/v1/agents/r/m", json={}).status_code == 503  # the call itself needs the model


def test_the_mcp_resource_over_http_reads_the_tenants_own_context(server: Server) -> None:
    with server.client("alpha") as a:
        assert a.put("/v1/roles/seen/context", json={"who": "alpha"}, headers={"If-Match": "*"}).status_code == 200

    async def alpha(client: Client) -> None:
        assert await read_json(client, "sandforge://roles/seen/context") == {"who": "alpha"}

    async def beta(client: Client) -> None:
        assert await read_json(client, "sandforge://roles/seen/context") == {}

    mcp_session(server, server.tokens["alpha"], alpha)
    mcp_session(server, server.tokens["beta"], beta)


def test_serve_and_mcp_on_one_tenant_see_one_state(server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    args = ["mcp", "--config", str(server.config), "--tenant", "alpha"]
    params = StdioServerParameters(command=sandforge_command(), args=args, env=env)
    with server.client("alpha") as http:
        tag = http.get("/v1/roles/counter/context").headers["etag"]
        assert http.put("/v1/roles/counter/context", json={"n": 100}, headers={"If-Match": tag}).status_code == 200

    async def body(client: Client) -> None:
        assert await read_json(client, "sandforge://roles/counter/context") == {"n": 100}
        called = ok(await client.call_tool("call_stored_tool", {"role": "counter", "method": "incr"}))
        assert called["value"] == 101  # mcp's workspace counts on from what serve's PUT committed

    stdio_session(params, body)
    with server.client("alpha") as http:
        assert http.get("/v1/roles/counter/context").json() == {"n": 101}  # and serve sees what mcp committed
        assert http.post("/v1/agents/counter/incr", json={}).json()["value"] == 102


def test_the_context_outlives_a_restart(root: Path, server: Server) -> None:
    with server.client("alpha") as client:
        before = client.get("/v1/roles/keep/context")
        put = client.put("/v1/roles/keep/context", json={"n": 41}, headers={"If-Match": before.headers["etag"]})
        assert put.status_code == 200, put.text
        tag = client.get("/v1/roles/keep/context").headers["etag"]
    server.stop()
    again = start_server(root, CONFIG)
    try:
        with again.client("alpha") as client:
            read = client.get("/v1/roles/keep/context")
            assert read.json() == {"n": 41} and read.headers["etag"] == tag
            assert client.post("/v1/agents/keep/incr", json={}).json()["value"] == 42
    finally:
        again.stop()
