"""`sandforge serve` as a real process on loopback: authorization, tenant isolation, limits, typed errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.serverproc import SANDFORGE, Server, start_server

pytestmark = pytest.mark.slow

#: every /v1 endpoint, with a body that would be valid
ENDPOINTS: list[tuple[str, str, dict[str, object] | None]] = [
    ("POST", "/v1/exec", {"code": "return 1"}),
    ("POST", "/v1/agents/calc/add", {"args": [1]}),
    ("GET", "/v1/tools", None),
    ("GET", "/v1/tools/x", None),
    ("GET", "/v1/tools/x/get", None),
    ("GET", "/v1/calls", None),
    ("POST", "/v1/sessions", None),
    ("GET", "/v1/sessions", None),
    ("GET", "/v1/sessions/abc", None),
    ("POST", "/v1/sessions/abc/messages", {"text": "hi"}),
    ("POST", "/v1/policy/check", {"code": "return 1"}),
    ("GET", "/v1/roles/x/context", None),
    ("PUT", "/v1/roles/x/context", {"n": 1}),
    ("POST", "/v1/files", None),
    ("GET", "/v1/files", None),
    ("GET", "/v1/files/f_00000000000000000000000000000000", None),
    ("DELETE", "/v1/files/f_00000000000000000000000000000000", None),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve")
    (root / "a_programs.json").write_text(json.dumps(["return 'A-secret'\n"]))
    (root / "a_chat.json").write_text(json.dumps(["hello from alpha"]))
    (root / "b_programs.json").write_text(json.dumps(["return tool('x').get().value\n", "return 'B-own'\n"]))
    config = {
        "state_dir": "state",
        "tenants": [
            {"name": "alpha",
             "provider": {"kind": "scripted", "programs": "a_programs.json", "chat_script": "a_chat.json"}},
            {"name": "beta", "provider": {"kind": "scripted", "programs": "b_programs.json"},
             "quotas": {"max_body_bytes": 4096, "max_timeout_s": 5, "max_memory_mb": 256}},
            {"name": "gamma", "quotas": {"executions_per_minute": 3}},
        ],
    }  # fmt: skip
    srv = start_server(root, config)
    yield srv
    srv.stop()


def _call(client: httpx.Client, method: str, path: str, body: dict[str, object] | None) -> httpx.Response:
    return client.request(method, path, json=body) if body is not None else client.request(method, path)


def _assert_error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == error_type
    assert "\n" not in body["error"]["message"] and "Traceback" not in response.text


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
def test_every_endpoint_refuses_a_missing_or_wrong_token(
    server: Server, method: str, path: str, body: dict[str, object] | None
) -> None:
    for client in (
        server.client(),
        server.client(token="sf_wrong"),
        server.client(token=server.tokens["alpha"] + "x"),
        httpx.Client(base_url=server.url, headers={"Authorization": server.tokens["alpha"]}),  # no scheme
        httpx.Client(base_url=server.url, headers={"Authorization": f"Basic {server.tokens['alpha']}"}),
    ):
        with client:
            response = _call(client, method, path, body)
        _assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith('Bearer realm="sandforge"')


def test_a_revoked_token_is_refused_by_the_running_server(server: Server) -> None:
    out = subprocess.run(
        [SANDFORGE, "tokens", "create", "gamma", "--config", str(server.config)], capture_output=True, text=True
    )
    token = out.stdout.strip()
    assert out.returncode == 0 and token.startswith("sf_")
    assert token not in server.config.read_text()
    with server.client(token=token) as client:
        assert client.get("/v1/tools").status_code == 200
        revoked = subprocess.run(
            [SANDFORGE, "tokens", "revoke", token, "--config", str(server.config)], capture_output=True, text=True
        )
        assert revoked.returncode == 0, revoked.stderr
        for method, path, body in ENDPOINTS:
            _assert_error(_call(client, method, path, body), 401, "unauthorized")


def test_health_needs_no_token(server: Server) -> None:
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(server.url + "/readyz", timeout=60)
    assert ready.status_code == 200 and ready.json()["backends"] == {"subprocess": "ok"}


def test_exec_returns_the_exec_json_shape(server: Server, tmp_path: Path) -> None:
    program = "context['n'] = context.get('n', 0) + args[0]\nprint('hi')\nreturn kwargs['k']\n"
    with server.client("alpha") as client:
        response = client.post("/v1/exec", json={"code": program, "context": {"n": 1}, "args": [2], "kwargs": {"k": 3}})
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["value"], body["context"], body["stdout"]) == ("ok", 3, {"n": 3}, "hi\n")
    (tmp_path / "p.py").write_text(program)
    (tmp_path / "ctx.json").write_text('{"n": 1}')
    cli = subprocess.run(
        [SANDFORGE, "exec", str(tmp_path / "p.py"), "--context", str(tmp_path / "ctx.json"), "--args", "[2]",
         "--kwargs", '{"k": 3}', "--json"], capture_output=True, text=True,
    )  # fmt: skip
    expected = json.loads(cli.stdout)
    assert set(body) == set(expected) and set(body["metadata"]) == set(expected["metadata"])
    for key in ("status", "value", "context", "stdout", "error_type"):
        assert body[key] == expected[key]


def test_program_failures_are_outcomes_without_tracebacks_or_host_paths(server: Server) -> None:
    programs = [
        "def f():\n    raise ValueError('boom')\nf()\n",
        "import os\nreturn os.getcwd()\n",
        "return open('/etc/passwd').read()\n",
        "x = [1] * (10 ** 10)\n",
        "while True:\n    pass\n",
    ]
    state = str(server.root)
    with server.client("beta") as client:
        for program in programs:
            response = client.post("/v1/exec", json={"code": program, "timeout_s": 2})
            assert response.status_code == 200
            body = response.json()
            assert body["status"] == "error" and body["error_type"]
            text = response.text
            assert "Traceback" not in text and state not in text and sys.prefix not in text


@pytest.mark.parametrize(
    "payload, error_type",
    [
        ({"code": "return 1", "timeout_s": 60}, "limit_exceeded"),
        ({"code": "return 1", "memory_mb": 4096}, "limit_exceeded"),
        ({"code": "return 1", "backend": "nope"}, "invalid_request"),
        ({"code": 1}, "invalid_request"),
        ({"code": "return 1", "extra": True}, "invalid_request"),
        ({"code": "return 1", "args": {"a": 1}}, "invalid_request"),
        ({"code": "return 1", "timeout_s": -1}, "invalid_request"),
    ],
)
def test_malformed_or_over_limit_requests_are_typed_422(
    server: Server, payload: dict[str, object], error_type: str
) -> None:
    with server.client("beta") as client:
        _assert_error(client.post("/v1/exec", json=payload), 422, error_type)


def test_non_json_bodies_are_typed_422(server: Server) -> None:
    with server.client("beta") as client:
        for raw in (b"{", b"[1,2]", b"\xff\xfe", b"null"):
            response = client.post("/v1/exec", content=raw, headers={"Content-Type": "application/json"})
            _assert_error(response, 422, "invalid_request")


def test_oversized_bodies_are_413_with_or_without_a_length(server: Server) -> None:
    big = json.dumps({"code": "return 1", "context": {"x": "y" * 10_000}}).encode()
    with server.client("beta") as client:
        _assert_error(client.post("/v1/exec", content=big, headers={"Content-Type": "application/json"}),
                      413, "body_too_large")  # fmt: skip

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        response = client.post("/v1/exec", content=chunks(), headers={"Content-Type": "application/json"})
        _assert_error(response, 413, "body_too_large")
    with server.client("alpha") as client:  # alpha's limit is the default 1 MiB
        assert client.post("/v1/exec", content=big, headers={"Content-Type": "application/json"}).status_code == 200


def test_over_the_rate_quota_is_429_with_retry_after(server: Server) -> None:
    with server.client("gamma") as client:
        statuses = [client.post("/v1/exec", json={"code": "return 1"}) for _ in range(4)]
    assert [r.status_code for r in statuses[:3]] == [200, 200, 200]
    _assert_error(statuses[3], 429, "quota_exceeded")
    assert 1 <= int(statuses[3].headers["retry-after"]) <= 60


def test_tenants_cannot_see_each_others_tools_sessions_or_logs(server: Server) -> None:
    with server.client("alpha") as a, server.client("beta") as b:
        outcome = a.post("/v1/agents/x/get", json={}).json()
        assert outcome["status"] == "ok" and outcome["value"] == "A-secret"
        assert a.get("/v1/tools/x").status_code == 200
        assert a.get("/v1/tools/x/get").json()["code"] == "return 'A-secret'\n"
        assert [t["role"] for t in a.get("/v1/tools").json()] == ["x"]
        session = a.post("/v1/sessions").json()["id"]
        assert a.get(f"/v1/sessions/{session}").status_code == 200
        assert session in [s["id"] for s in a.get("/v1/sessions").json()["sessions"]]
        assert session not in [s["id"] for s in b.get("/v1/sessions").json()["sessions"]]
        # beta: the same names are simply not there (the same answer as for names nobody has)
        for path in ("/v1/tools/x", "/v1/tools/x/get", f"/v1/sessions/{session}", f"/v1/sessions/{session[:8]}"):
            _assert_error(b.get(path), 404, "not_found")
        assert b.get("/v1/tools").json() == []
        # beta's own runs of POST /v1/exec are in its log (issue 37), none of alpha's calls
        assert [c for c in b.get("/v1/calls").json() if c["source"] == "agent"] == []
        _assert_error(b.post(f"/v1/sessions/{session}/messages", json={"text": "hi"}), 404, "not_found")
        # a program of beta calling tool('x') reaches beta's x (beta's provider writes it), never alpha's
        nested = b.post("/v1/agents/main/run", json={}).json()
        assert nested["status"] == "ok" and nested["value"] == "B-own", nested
        assert a.get("/v1/tools/x/get").json()["code"] == "return 'A-secret'\n"
        calls_a = a.get("/v1/calls").json()
        calls_b = b.get("/v1/calls", params={"role": "x"}).json()
        assert [c["value"] for c in calls_a if c["source"] == "agent"] == ["A-secret"]
        assert [c["value"] for c in calls_b] == ["B-own"]
        assert not {c["call_id"] for c in calls_a} & {c["call_id"] for c in b.get("/v1/calls").json()}


def test_tenants_cannot_list_fetch_delete_or_run_each_others_files(server: Server) -> None:
    program = "with open('outputs/out.txt', 'w') as f:\n    f.write(open('inputs/in.txt').read())\nreturn 1\n"
    with server.client("alpha") as a, server.client("beta") as b:
        up = a.post("/v1/files", files={"file": ("in.txt", b"A-secret")})
        assert up.status_code == 201, up.text
        upload = up.json()["files"][0]
        ran = a.post("/v1/exec", json={"code": program, "file_refs": {"in.txt": upload["uri"]}}).json()
        output = ran["files"][0]
        assert ran["status"] == "ok" and a.get(output["url"]).content == b"A-secret"
        assert {f["id"] for f in a.get("/v1/files").json()["files"]} >= {upload["id"], output["id"]}
        assert all(f["id"] not in (upload["id"], output["id"]) for f in b.get("/v1/files").json()["files"])
        for file in (upload, output):
            _assert_error(b.get(file["url"]), 404, "not_found")
            _assert_error(b.delete(file["url"]), 404, "not_found")
            ref = {"code": program, "file_refs": {"in.txt": file["id"]}}
            _assert_error(b.post("/v1/exec", json=ref), 422, "invalid_request")
            assert a.get(file["url"]).content == b"A-secret"


def test_policy_check_reports_the_tenants_verdict(server: Server) -> None:
    with server.client("alpha") as client:
        ok = client.post("/v1/policy/check", json={"code": "return 1"}).json()
        bad = client.post("/v1/policy/check", json={"code": "import os\nreturn 1"}).json()
    assert ok["verdict"] == "approved" and bad["verdict"] != "approved"
    assert bad["violations"][0]["violation_type"] == "forbidden_module"


def test_unknown_routes_are_typed(server: Server) -> None:
    with server.client("alpha") as client:
        _assert_error(client.get("/v1/nothing"), 404, "not_found")
        _assert_error(client.delete("/v1/exec"), 405, "method_not_allowed")


def test_the_audit_log_records_who_called_what(server: Server) -> None:
    with server.client("alpha") as client:
        client.get("/v1/tools")
    with server.client(token="sf_bad") as client:
        client.get("/v1/tools")
    lines = [json.loads(x) for x in (server.root / "state" / "audit.jsonl").read_text().splitlines()]
    assert any(r["tenant"] == "alpha" and r["path"] == "/v1/tools" and r["status"] == 200 for r in lines)
    assert any(r["tenant"] is None and r["status"] == 401 for r in lines)
    assert all(server.tokens["alpha"] not in json.dumps(r) for r in lines)


def test_a_chat_turn_over_http(server: Server) -> None:
    with server.client("alpha") as a, server.client("beta") as b:
        session = a.post("/v1/sessions")
        assert session.status_code == 201
        sid = session.json()["id"]
        turn = a.post(f"/v1/sessions/{sid}/messages", json={"text": "hi"})
        assert turn.status_code == 200, turn.text
        assert turn.json()["text"] == "hello from alpha"
        view = a.get(f"/v1/sessions/{sid[:10]}").json()
        assert view["session"]["id"] == sid and len(view["messages"]) == 2
        _assert_error(a.post(f"/v1/sessions/{sid}/messages", json={"text": ""}), 422, "invalid_request")
        beta_session = b.post("/v1/sessions").json()["id"]
        _assert_error(b.post(f"/v1/sessions/{beta_session}/messages", json={"text": "hi"}), 422,
                      "provider_not_configured")  # fmt: skip
