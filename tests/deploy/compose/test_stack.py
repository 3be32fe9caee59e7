"""The service as operators deploy it: deploy/compose.yaml on the service image, tested from outside (issue 42).

One stack per session (conftest.py): the first start's tokens and readiness, the authorisation matrix, an agent
call and ``/v1/exec``, MCP over streamable HTTP with the official TypeScript client, the dashboard login, no
secret in the image or the logs, a restart with state kept, a ``docker kill`` mid-call with nothing
half-committed, and a stack started without what its backend needs, which must report not ready and turn
unhealthy. The files run in this order: the stack is restarted and killed last.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.deploy.compose.conftest import REPO, Stack, compose_command, leftovers, stack_env

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("compose")]

TENANTS = ("acme", "globex")
TOKEN_RE = re.compile(rb"sf_[A-Za-z0-9_-]{43}")


def add(stack: Stack, amount: int, tenant: str = "acme") -> httpx.Response:
    with stack.client(tenant) as c:
        return c.post("/v1/agents/calculator/add", json={"args": [amount]})


def test_the_first_start_makes_private_tokens_and_the_stack_turns_healthy(stack: Stack) -> None:
    assert stack.health(stack.container) == "healthy"
    ready = httpx.get(f"{stack.url}/readyz", timeout=60)
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "backends": {"subprocess": "ok"}}
    for tenant in TENANTS:
        assert TOKEN_RE.fullmatch(stack.tokens[tenant].encode())  # type: ignore[index]
        mode = stack.exec("stat", "-c", "%a %u", f"/var/lib/sandforge/initial-tokens/{tenant}.token").split()
        assert mode == ["600", "10001"]
    assert stack.exec("id", "-u").strip() == "10001"  # never root inside
    config = stack.exec("cat", "/var/lib/sandforge/server.yaml")
    assert "sha256:" in config and "sf_" not in config  # hashes only


def test_the_authorisation_matrix_holds_across_tenants(stack: Stack) -> None:
    with stack.client("acme") as acme:
        session = acme.post("/v1/sessions").json()["id"]
        assert acme.post("/v1/exec", json={"code": "return 1"}).json()["value"] == 1
    routes = [("GET", "/v1/tools"), ("GET", "/v1/calls"), ("POST", "/v1/exec"), ("GET", f"/v1/sessions/{session}")]
    for method, path in routes:
        body = {"json": {"code": "return 1"}} if method == "POST" else {}
        for headers in ({}, {"Authorization": "Bearer sf_" + "x" * 43}, {"Authorization": "Basic YTpi"}):
            refused = httpx.request(method, stack.url + path, headers=headers, timeout=30, **body)
            assert refused.status_code == 401, (method, path, headers, refused.text)
            assert "sf_" not in refused.text
        with stack.client("acme") as acme:
            assert acme.request(method, path, **body).status_code == 200
    with stack.client("globex") as globex:
        assert globex.get(f"/v1/sessions/{session}").status_code == 404  # another tenant's session is not found
        assert globex.get("/v1/calls").json() == []
        # globex has no provider: its agent call is refused, and acme's tool is not globex's to reuse
        refused = globex.post("/v1/agents/calculator/add", json={"args": [1]})
        assert refused.json()["error_type"] == "provider"
        assert globex.get("/v1/tools").json() == []


def test_an_agent_call_persists_its_tool_and_exec_runs_under_the_policy(stack: Stack) -> None:
    first = add(stack, 0).json()
    assert first["status"] == "ok"
    again = add(stack, 0).json()
    assert again["status"] == "ok" and again["metadata"]["program_source"] == "persisted"
    with stack.client("acme") as acme:
        assert [t["role"] for t in acme.get("/v1/tools").json()] == ["calculator"]
        refused = acme.post("/v1/exec", json={"code": "import os\nreturn os.getcwd()"}).json()
        assert refused["error_type"] == "guardrail_violation" and "forbidden_module" in refused["error_message"]
        walled = acme.post("/v1/exec", json={"code": "return open('/etc/passwd').read()"}).json()
        assert walled["status"] == "error"


def test_mcp_over_streamable_http_with_the_typescript_client(stack: Stack) -> None:
    from tests.service.mcp.test_real_clients import Case, check, drive

    assert add(stack, 0).json()["status"] == "ok"  # the stored tool the listing must show
    cases = [
        Case("run_tool_code", {"code": "return sum(args)", "args": [40, 2]}),
        Case("run_tool_code", {"code": "import os\nreturn 1"}, error="guardrail_violation", lane="guardrail"),
    ]
    target = {"url": f"{stack.url}/mcp", "headers": {"Authorization": f"Bearer {stack.tokens['acme']}"}}  # type: ignore[index]
    answer = drive("sdk_client.mjs", target, cases)
    assert answer["server"]["name"] == "sandforge"
    assert {"run_tool_code", "calculator.add"} <= {t["name"] for t in answer["tools"]}
    assert [r["name"] for r in answer["results"] if not r["ok"]] == []  # the client accepted every result
    for case, result in zip(cases, answer["results"], strict=True):
        check(case, result["result"])


def test_the_dashboard_login_works_through_the_stack(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        assert c.post("/dashboard/login", data={"token": "sf_" + "y" * 43}).status_code == 401
        ok = c.post("/dashboard/login", data={"token": stack.tokens["globex"]}, follow_redirects=False)  # type: ignore[index]
        assert ok.status_code == 303
        cookie = ok.headers["set-cookie"].split(";", 1)[0]
        page = c.get("/dashboard", headers={"Cookie": cookie})
        assert page.status_code == 200 and "globex" in page.text and "acme" not in page.text


def test_no_secret_is_in_the_image_layers_or_the_logs(stack: Stack, service_image: str) -> None:
    tokens = [t.encode() for t in stack.tokens.values()]  # type: ignore[union-attr]
    saved = subprocess.run(["docker", "save", service_image], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(saved)) as outer:
        for member in outer.getmembers():
            if not member.isfile():
                continue
            data = outer.extractfile(member).read()  # type: ignore[union-attr]
            blobs = [data]
            if data[:262][257:262] == b"ustar" or member.name.endswith(".tar"):
                with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                    blobs = [layer.extractfile(m).read() for m in layer.getmembers() if m.isfile()]  # type: ignore[union-attr]
            for blob in blobs:
                assert not any(t in blob for t in tokens), member.name
                assert b"initial-tokens/" not in blob or b"sf_" not in blob
    logs = stack.run("logs", "--no-color").stdout + stack.run("logs", "--no-color").stderr
    assert not TOKEN_RE.search(logs.encode()), "a token reached the container's logs"
    assert "Traceback" not in logs


def test_a_restart_keeps_tokens_tools_and_tool_state(stack: Stack) -> None:
    before = add(stack, 7).json()["value"]
    tokens = dict(stack.tokens)  # type: ignore[arg-type]
    stack.run("restart", "sandforge")
    stack.wait_healthy()
    assert {t: stack.exec("cat", f"/var/lib/sandforge/initial-tokens/{t}.token").strip() for t in TENANTS} == tokens
    after = add(stack, 1).json()
    assert after["metadata"]["program_source"] == "persisted"
    assert after["value"] == before + 1  # the role's context survived the restart


def test_docker_kill_mid_call_leaves_nothing_half_committed(stack: Stack) -> None:
    with stack.client("acme") as acme:
        base = acme.post("/v1/agents/calculator/add", json={"args": [0]}).json()["value"]
    answered: list[int] = []
    sent: list[int] = []
    stop = threading.Event()

    def caller(offset: int) -> None:
        k = offset
        while not stop.is_set() and k < 40:
            amount = 1 << k
            sent.append(amount)
            try:
                with stack.client("acme") as c:
                    r = c.post("/v1/agents/calculator/add", json={"args": [amount]}, timeout=30)
                if r.status_code == 200 and r.json()["status"] == "ok":
                    answered.append(amount)
            except httpx.HTTPError:
                return
            k += 2

    threads = [threading.Thread(target=caller, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(answered) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(["docker", "kill", stack.container], capture_output=True, check=True)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert answered, "no call was answered before the kill"
    stack.run("start", "sandforge")
    stack.wait_healthy()
    for db in stack.exec("sh", "-c", "find /var/lib/sandforge -name '*.db' -o -name '*.sqlite'").split():
        check = f"import sqlite3; print(sqlite3.connect({db!r}).execute('pragma integrity_check').fetchone()[0])"
        assert stack.exec("python3", "-c", check).strip() == "ok", db
    total = add(stack, 0).json()["value"] - base
    committed = {1 << k for k in range(40) if total & (1 << k)}
    assert set(answered) <= committed, "an answered call's state was lost"
    assert committed <= set(sent), "state that no call sent"


def test_a_stack_without_what_its_backend_needs_is_not_ready_and_turns_unhealthy(
    service_image: str, tmp_path: Path
) -> None:
    profile = json.loads((REPO / "deploy" / "seccomp.json").read_text())
    profile["syscalls"].append({"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1})
    (tmp_path / "seccomp.json").write_text(json.dumps(profile))  # like Docker's default: no namespaces
    project = f"sfbroken{uuid.uuid4().hex[:8]}"
    env = stack_env(service_image, SANDFORGE_SECCOMP=str(tmp_path / "seccomp.json"), SANDFORGE_HEALTH_START_PERIOD="4s")
    broken = Stack(compose_command(), project, env)  # failed checks count after the start period: 4 s, not 30
    try:
        broken.run("up", "-d")
        container, deadline = broken.container, time.monotonic() + 120
        while (status := broken.health(container)) != "unhealthy":
            assert status != "healthy", "a service without user namespaces reported healthy"
            assert time.monotonic() < deadline, f"still {status!r}"
            time.sleep(0.5)
        port = broken.run("port", "sandforge", "8700").stdout.strip().rsplit(":", 1)[1]
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=60)
        assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
        assert "namespace" in ready.json()["backends"]["subprocess"]
    finally:
        broken.run("down", "-v", check=False)
    assert leftovers(project) == {"containers": [], "networks": [], "volumes": []}
