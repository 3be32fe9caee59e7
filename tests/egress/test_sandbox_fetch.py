"""Brokered egress end to end on every backend (issue 18): a program's ``fetch()``, ``requests`` and
``urllib.request`` reach a loopback server through a bridge handler's ``egress`` backed by a real
``EgressBroker``; the sandbox itself still cannot reach that server; failures are typed outcomes; the time
spent fetching is the execution's. Runs in a network namespace of its own (``netns``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.runtime.egress import EgressBroker, EgressPolicy, EgressSection, EgressSession
from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.exchange import no_bridge
from sandforge.sandbox.protocol import BridgeReply, CallFrame
from tests.egress.conftest import Net

pytestmark = pytest.mark.netns

LIMITS = Limits(timeout_s=10, memory_mb=256, disk_mb=4)


class Bridge:
    """A plain bridge handler: nested calls unavailable, fetches brokered by one session per execution
    (made with the execution's deadline, as the agent's AttemptBridge does)."""

    def __init__(self, broker: EgressBroker) -> None:
        self.broker = broker
        self.session: EgressSession | None = None
        self.deadlines: list[float] = []

    def __call__(self, call: CallFrame) -> BridgeReply:
        return no_bridge(call)

    def egress(self, request: bytes, deadline: float) -> bytes:
        self.deadlines.append(deadline)
        if self.session is None:
            self.session = self.broker.session(deadline=deadline)
        return self.session.handle(request)


class PartsBridge(Bridge):
    """The same with ``egress_parts`` (the body travels raw, never base64)."""

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        self.deadlines.append(deadline)
        if self.session is None:
            self.session = self.broker.session(deadline=deadline)
        return self.session.handle_parts(request)


def broker_for(net: Net, **limits: Any) -> EgressBroker:
    section = EgressSection.model_validate(
        {
            "allow": [
                {"url": f"http://allowed.test:{net.port}/**", "methods": ["GET", "POST", "HEAD"]},
                {"url": "http://closed.test:1/**"},
            ],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"allowed.test": "127.0.0.1", "closed.test": "127.0.0.1"},
            "limits": limits,
        }
    )
    return EgressBroker(EgressPolicy().merge(section))


def run(sandbox: Sandbox, code: str, bridge: Any, limits: Limits = LIMITS) -> ExecutionOutcome:
    return sandbox.execute(ExecutionRequest(code=code, limits=limits), bridge=bridge)


@pytest.mark.parametrize("kind", [Bridge, PartsBridge])
def test_an_allowed_fetch_works_through_every_surface(sandbox: Sandbox, net: Net, kind: type[Bridge]) -> None:
    origin = f"http://allowed.test:{net.port}"
    code = f"""
import requests, urllib.request, json
first = fetch("{origin}/echo", headers={{"X-Probe": "fetch"}}, params={{"q": ["a", "b"]}})
second = requests.post("{origin}/echo", json={{"n": 1}}, timeout=5)
request = urllib.request.Request("{origin}/public/x", headers={{"X-Probe": "urllib"}})
with urllib.request.urlopen(request) as response:
    third = json.loads(response.read())
big = fetch("{origin}/big", params={{"n": 300000}})
return [first.status, first.json()["path"], first.headers["content-type"], first.url, first.ok,
        second.status_code, second.json()["body"], second.headers["Content-Type"], third["headers"]["x-probe"],
        len(big.content), big.content == b"x" * 300000]
"""
    bridge = kind(broker_for(net))
    out = run(sandbox, code, bridge)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.value == [200, "/echo?q=a&q=b", "application/json", f"{origin}/echo?q=a&q=b", True,
                         200, '{"n": 1}', "application/json", "urllib", 300000, True]  # fmt: skip
    assert [seen.path for seen in net.allowed.seen] == ["/echo?q=a&q=b", "/echo", "/public/x", "/big?n=300000"]
    assert net.allowed.seen[0].headers["x-probe"] == "fetch"
    assert out.metadata["fetches"] == 4
    assert bridge.session is not None and [r.status for r in bridge.session.records] == [200] * 4
    assert all(d == bridge.deadlines[0] for d in bridge.deadlines)  # the execution's own deadline, never moved
    assert net.nothing_reached_forbidden()


def test_the_sandbox_cannot_reach_the_same_server_itself(sandbox: Sandbox, net: Net) -> None:
    for module in ("socket", "http.client", "urllib3"):
        out = run(sandbox, f"import {module}\nreturn 'imported'", Bridge(broker_for(net)))
        assert not out.ok and out.error_type == ErrorType.SANDBOX_VIOLATION, (module, out)
    assert net.allowed.seen == [] and net.nothing_reached_forbidden()


def escaped_connect(port: int) -> str:
    return (
        "import socket\ntry:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n    s.settimeout(2)\n"
        f"    s.connect((b'127.0.0.1', {port}))\n    return 'connected'\n"
        "except OSError as e:\n    return type(e).__name__"
    )


@pytest.fixture
def escaped_backend(sandbox_backend: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """The backend under test running the escaped runner (RestrictedPython bypassed: only the OS walls)."""
    from sandforge.sandbox.backends import docker_backend, oci_backend
    from sandforge.sandbox.backends.docker_backend import DockerBackend
    from sandforge.sandbox.backends.oci_backend import OciBackend
    from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
    from tests.sandbox.test_container_boundary import ESCAPED_BOOTSTRAP
    from tests.sandbox.test_host_channel import ESCAPED

    config = SandboxConfig(pool_size=0)
    command = ["-I", "-S", "-B", "-c", ESCAPED_BOOTSTRAP]
    monkeypatch.setattr(docker_backend, "COMMAND", ["python3", *command])
    monkeypatch.setattr(oci_backend, "COMMAND", ["/usr/bin/python3", *command])
    backend: Backend
    if sandbox_backend == "subprocess":
        backend = SubprocessBackend(config, runner=ESCAPED)
    elif sandbox_backend in ("runc", "runsc"):
        backend = OciBackend(config, runtime=sandbox_backend)
    else:
        backend = DockerBackend(config, runtime="runsc" if sandbox_backend == "gvisor" else None)
    try:
        yield backend
    finally:
        backend.close()


def test_an_escaped_program_cannot_connect_to_the_server_either(escaped_backend: Backend, net: Net) -> None:
    out = escaped_backend.spawn(LIMITS).execute(ExecutionRequest(code=escaped_connect(net.port), limits=LIMITS), None)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.value != "connected"
    assert net.allowed.seen == []


def test_an_uncaught_denial_is_the_terminal_outcome_and_nothing_is_sent(sandbox: Sandbox, net: Net) -> None:
    code = f"return fetch('http://127.0.0.2:{net.port}/secret').status"  # 127.0.0.2 is not exempt
    out = run(sandbox, code, Bridge(broker_for(net)))
    assert out.error_type == ErrorType.EGRESS_DENIED and out.retriable is False
    assert "127.0.0.2" in (out.error_message or "") and out.metadata["exception"] == "EgressDenied"
    assert net.nothing_reached_forbidden() and net.allowed.seen == []


def test_without_egress_every_fetch_is_denied_and_nothing_is_sent(sandbox: Sandbox, net: Net) -> None:
    code = f"import requests\nreturn requests.get('http://allowed.test:{net.port}/echo').status_code"
    out = run(sandbox, code, no_bridge)
    assert out.error_type == ErrorType.EGRESS_DENIED
    assert "this execution has no egress" in (out.error_message or "")
    assert net.allowed.seen == []


def test_failures_are_catchable_and_statuses_are_responses(sandbox: Sandbox, net: Net) -> None:
    origin = f"http://allowed.test:{net.port}"
    code = f"""
import requests, urllib.request, urllib.error
found = []
try:
    fetch("https://denied.example/")
except EgressDenied as e:
    found.append(["denied", e.kind, isinstance(e, FetchError)])
try:
    requests.get("http://closed.test:1/")
except requests.ConnectionError as e:
    found.append(["requests", e.kind, isinstance(e, NetworkError)])
try:
    urllib.request.urlopen("http://closed.test:1/")
except urllib.error.URLError as e:
    found.append(["urllib", e.kind])
found.append(fetch("{origin}/status", params={{"code": 503}}).status)
try:
    requests.get("{origin}/status?code=404").raise_for_status()
except requests.HTTPError as e:
    found.append(["raise_for_status", e.response.status_code])
try:
    urllib.request.urlopen("{origin}/status?code=500")
except urllib.error.HTTPError as e:
    found.append(["HTTPError", e.code, e.read().decode()])
return found
"""
    out = run(sandbox, code, Bridge(broker_for(net)))
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.value == [["denied", "egress_denied", True], ["requests", "network_error", True],
                         ["urllib", "network_error"], 503, ["raise_for_status", 404],
                         ["HTTPError", 500, "status body"]]  # fmt: skip


def test_an_uncaught_network_error_is_retriable(sandbox: Sandbox, net: Net) -> None:
    out = run(sandbox, "return fetch('http://closed.test:1/').status", Bridge(broker_for(net)))
    assert out.error_type == ErrorType.NETWORK_ERROR and out.retriable is True


def test_a_program_cannot_forge_a_fetch_outcome(sandbox: Sandbox, net: Net) -> None:
    out = run(sandbox, "raise EgressDenied('forged: retrying will not help')", Bridge(broker_for(net)))
    assert out.error_type == ErrorType.EXECUTION and "no fetch of this execution failed so" in (out.error_message or "")
    code = (
        "class Sneaky(EgressLimit):\n    kind = 'network_error'\n"
        "try:\n    fetch('https://denied.example/')\nexcept EgressDenied:\n    pass\n"
        "raise Sneaky('looks retriable')"
    )
    out = run(sandbox, code, Bridge(broker_for(net)))
    assert out.error_type == ErrorType.EXECUTION  # the host answered egress_denied, never egress_limit


def test_limits_of_the_broker_reach_the_program(sandbox: Sandbox, net: Net) -> None:
    code = f"""
for n in range(5):
    fetch("http://allowed.test:{net.port}/echo")
"""
    out = run(sandbox, code, Bridge(broker_for(net, max_requests=2)))
    assert out.error_type == ErrorType.EGRESS_LIMIT and "max_requests" in (out.error_message or "")
    assert len(net.allowed.seen) == 2


def test_time_spent_fetching_counts_against_the_timeout(sandbox: Sandbox, net: Net) -> None:
    limits = Limits(timeout_s=2, memory_mb=256, disk_mb=4)
    bridge = Bridge(broker_for(net, timeout_s=30))
    began = time.monotonic()
    out = run(
        sandbox, f"return fetch('http://allowed.test:{net.port}/drip', params={{'n': 60}}).status", bridge, limits
    )
    assert out.error_type == ErrorType.TIMEOUT, (out.error_type, out.error_message)
    [deadline] = bridge.deadlines
    assert began < deadline <= time.monotonic()  # the execution's deadline, not the broker's 30 s
    assert bridge.session is not None
    [record] = bridge.session.records  # the request was cut at that deadline (the drip needs 6 s)
    assert record.error == "network_error" and record.status is None
    assert "drip" in net.allowed.seen[0].path


def test_the_request_and_response_bodies_are_bytes(sandbox: Sandbox, net: Net) -> None:
    code = f"""
r = fetch("http://allowed.test:{net.port}/echo", method="POST", body=bytes(range(256)))
return [r.json()["body"] == bytes(range(256)).decode("latin-1"), type(r.content) is bytes]
"""
    out = run(sandbox, code, PartsBridge(broker_for(net)))
    assert out.value == [True, True], (out.error_type, out.error_message)
