"""The Ray executor on a real three-node local cluster (issue 22): executions run on the nodes' sandbox hosts,
nested calls, declarations and brokered fetches travel back to the caller, large context texts travel once
per node, placement prefers idle nodes and never picks a node without the backend, token auth is on and the
cluster listens on 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.cluster.local import LocalCluster, NodeSpec
from sandforge.sandbox.protocol import CallFrame, DeclareFrame
from tests.cluster.conftest import start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPECS = [NodeSpec(backends=("subprocess",)), NodeSpec(backends=("subprocess",)), NodeSpec(backends=("runc",))]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from start_cluster(tmp_path_factory.mktemp("state") / "cluster", SPECS)  # `sandforge cluster`'s layout


@pytest.fixture(scope="module")
def sandbox(cluster: LocalCluster) -> Iterator[Sandbox]:
    state = cluster.state()
    assert state is not None
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1)) as sb:
        yield sb


def node_ids(sandbox: Sandbox) -> dict[str, frozenset[str]]:
    return {n.node_id: n.backends for n in sandbox._cluster().nodes(refresh=True)}


class Recorder:
    """A caller-side bridge: answers nested calls, declarations and fetches, and records on which process
    and thread it ran (the caller's, never a node's)."""

    def __init__(self, gate: threading.Barrier | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.declared: list[str] = []
        self.fetched: list[dict[str, Any]] = []
        self.pids: set[int] = set()
        self.gate = gate

    def __call__(self, frame: CallFrame) -> dict[str, Any]:
        self.pids.add(os.getpid())
        self.calls.append(frame.model_dump(mode="json"))
        if self.gate is not None:
            self.gate.wait(timeout=60)
        return {"status": "ok", "value": {"echo": frame.args, "method": frame.method}}

    def declare(self, frame: DeclareFrame) -> dict[str, Any]:
        self.declared.append(frame.target.name)
        return {"status": "ok"}

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        self.pids.add(os.getpid())
        self.fetched.append(json.loads(request))
        response = {"status": 200, "headers": {"content-type": "text/plain"}, "url": "https://news.example.com/",
                    "body_b64": "", "elapsed_ms": 1.0}  # fmt: skip
        return json.dumps({"response": response}).encode(), b"hello from the caller"


def test_an_execution_runs_on_a_node_and_returns_its_context(sandbox: Sandbox) -> None:
    request = ExecutionRequest(code="context['n'] = context['n'] + 1\ndel context['gone']\nreturn 42",
                               context={"n": 1, "gone": True, "kept": [1, 2]})  # fmt: skip
    outcome = sandbox.execute(request)
    assert outcome.ok, outcome.error_message
    assert outcome.value == 42
    assert outcome.context == {"n": 2, "kept": [1, 2]}
    assert outcome.metadata["cluster_node"] in node_ids(sandbox)
    assert outcome.backend == "subprocess"


def test_a_program_error_comes_back_typed(sandbox: Sandbox) -> None:
    outcome = sandbox.execute(ExecutionRequest(code="raise ValueError('boom')"))
    assert not outcome.ok
    assert outcome.error_type is ErrorType.EXECUTION
    assert "boom" in (outcome.error_message or "")


def test_nested_calls_declarations_and_fetches_are_served_by_the_caller(sandbox: Sandbox) -> None:
    bridge = Recorder()
    code = (
        "d = delegate('writer', purpose='draft')\n"
        "r = tool('search').find('ray', limit=2)\n"
        "page = fetch('https://news.example.com/')\n"
        "return [r.value, page.status, page.text]"
    )
    outcome = sandbox.execute(ExecutionRequest(code=code), bridge=bridge)
    assert outcome.ok, outcome.error_message
    assert outcome.value == [{"echo": ["ray"], "method": "find"}, 200, "hello from the caller"]
    assert [c["target"]["name"] for c in bridge.calls] == ["search"]
    assert bridge.calls[0]["kwargs"] == {"limit": 2}
    assert bridge.declared == ["writer"]
    assert bridge.fetched[0]["url"] == "https://news.example.com/"
    assert bridge.pids == {os.getpid()}  # answered here, in the caller's process
    node_pids = {row["pid"] for row in sandbox._cluster().status()}
    assert os.getpid() not in node_pids  # and the program ran elsewhere


def test_without_a_bridge_nested_calls_and_fetches_are_refused_on_the_node(sandbox: Sandbox) -> None:
    code = (
        "r = tool('search').find('x')\n"
        "try:\n    fetch('https://news.example.com/')\n    f = 'sent'\nexcept Exception as e:\n    f = str(e)\n"
        "return [r.ok, r.error_type, f]"
    )
    outcome = sandbox.execute(ExecutionRequest(code=code))
    assert outcome.ok, outcome.error_message
    assert outcome.value[:2] == [False, "nested_calls_unavailable"]
    assert "no egress" in outcome.value[2]  # nothing was sent anywhere


def test_large_context_texts_travel_once_per_node(sandbox: Sandbox) -> None:
    big = "x" * (200 * 1024)
    executor = sandbox._cluster()
    outcomes = [
        sandbox.execute(ExecutionRequest(code="return len(context['big'])", context={"big": big, "i": i}))
        for i in range(4)
    ]
    assert all(o.ok and o.value == len(big) for o in outcomes), [o.error_message for o in outcomes]
    used = {o.metadata["cluster_node"] for o in outcomes}
    rows = {row["node_id"]: row for row in executor.status()}
    for node_id in used:
        assert rows[node_id]["cached_blobs"] == 1  # one copy per node, however many executions
    known = {n.node_id: n.known for n in executor.nodes()}
    assert all(len(known[node_id]) == 1 for node_id in used)


def test_a_node_missing_a_large_text_gets_it_again(sandbox: Sandbox) -> None:
    from sandforge.sandbox.cluster import wire
    from sandforge.sandbox.context import ContextSnapshot

    big = "y" * (100 * 1024)
    text = ContextSnapshot.from_dict({"big": big})["big"]
    executor = sandbox._cluster()
    for node in executor.nodes():
        node.known.add(wire.digest(text))  # the executor believes every node holds it: none does
    outcome = sandbox.execute(ExecutionRequest(code="return context['big'][:3]", context={"big": big}))
    assert outcome.ok, outcome.error_message
    assert outcome.value == "yyy"


def test_a_node_without_the_backend_is_never_chosen(sandbox: Sandbox) -> None:
    nodes = node_ids(sandbox)
    runc_only = {n for n, b in nodes.items() if b == frozenset({"runc"})}
    assert len(runc_only) == 1
    outcomes = [sandbox.execute(ExecutionRequest(code="return 1")) for _ in range(6)]
    assert all(o.ok for o in outcomes)
    assert not {o.metadata["cluster_node"] for o in outcomes} & runc_only
    missing = sandbox.execute(ExecutionRequest(code="return 1"), backend="gvisor")
    assert missing.error_type is ErrorType.SANDBOX_UNAVAILABLE
    assert not missing.retriable
    assert "no node of the cluster offers" in (missing.error_message or "")


def test_a_request_never_waits_behind_a_busy_node_while_another_is_idle(sandbox: Sandbox) -> None:
    gate = threading.Barrier(3)  # two executions parked in a nested call, and this test
    bridge = Recorder(gate)
    results: list[Any] = []

    def run() -> None:
        results.append(sandbox.execute(ExecutionRequest(code="return tool('t').wait().ok"), bridge=bridge))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    gate.wait(timeout=120)  # both are running at once: each holds its node
    for t in threads:
        t.join(timeout=120)
    assert [o.value for o in results] == [True, True]
    assert len({o.metadata["cluster_node"] for o in results}) == 2  # two idle subprocess nodes, one each


def test_status_shows_each_nodes_pools_and_load(sandbox: Sandbox) -> None:
    sandbox.execute(ExecutionRequest(code="return 1"))
    rows = sandbox._cluster().status()
    assert len(rows) == 3
    for row in rows:
        assert "error" not in row, row
        assert {"pools", "in_flight", "executed", "load", "pid"} <= set(row)
    assert any(p["backend"] == "subprocess" for row in rows for p in row["pools"])


def test_the_cluster_listens_on_loopback_only(cluster: LocalCluster, sandbox: Sandbox) -> None:
    assert sandbox.execute(ExecutionRequest(code="return 1")).ok  # connected: this process is a Ray driver
    pids = {p.pid for p in cluster.processes()} | {os.getpid()}  # the driver's own servers too
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    addresses = {c.laddr.ip for c in listening}
    assert addresses
    assert addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses
    channels = {n.channel.address for n in sandbox._cluster().nodes() if n.channel is not None}
    assert channels, "the hosts' direct channels are open"
    assert channels <= {(c.laddr.ip, c.laddr.port) for c in listening}, "and among the sockets checked above"


def test_a_caller_without_the_token_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    state = cluster.state()
    assert state is not None
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    probe = (
        "import os, ray, sys\n"
        "try:\n"
        "    ray.init(address=os.environ['PROBE_ADDRESS'], namespace='sandforge')\n"
        "    print('NODES', len(ray.nodes()))\n"
        "except Exception as exc:\n"
        "    print('REFUSED', type(exc).__name__)\n"
    )
    cases = [(address, token) for address in (state.gcs_address, state.client_address) for token in (str(wrong), None)]
    probes = []
    for address, token in cases:  # a driver on the GCS and a Ray Client alike; the four side by side
        # Ray Client retries a refused handshake 5 + 10 + 15 s by default: 1 + 2 + 4 s says the same
        env = {**os.environ, **cluster.env(), "PROBE_ADDRESS": address, "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1"}
        if token is None:
            env.pop("RAY_AUTH_TOKEN_PATH")
            env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
        else:
            env["RAY_AUTH_TOKEN_PATH"] = token
        probes.append(subprocess.Popen([sys.executable, "-c", probe], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))  # fmt: skip
    try:
        for (address, token), proc in zip(cases, probes, strict=True):
            stdout, stderr = proc.communicate(timeout=180)
            assert "NODES" not in stdout, (address, token, stdout, stderr[-2000:])
    finally:
        for proc in probes:
            proc.kill()  # a no-op for one that ended
            proc.wait()
    assert oct(Path(state.token_file).stat().st_mode & 0o777) == "0o600"


def test_the_wire_carries_no_pickled_objects_into_the_request() -> None:
    from sandforge.sandbox.cluster import wire

    request = ExecutionRequest(code="return 1", context={"a": 1, "big": "z" * 70000})
    message, blobs = wire.request_to_wire(request)
    allowed = (dict, list, str, bytes, int, float, bool, type(None))

    def walk(value: Any) -> None:
        assert isinstance(value, allowed), type(value)
        if isinstance(value, dict):
            for k, v in value.items():
                assert isinstance(k, str)
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(message)
    walk(blobs)
    rebuilt = wire.request_from_wire(message, blobs)
    assert not isinstance(rebuilt, list)
    assert rebuilt.context == request.context
    assert wire.request_from_wire(message, {}) == list(blobs)  # a missing text is named, never guessed


def test_an_agent_call_and_its_nested_call_run_on_the_cluster_and_commit(sandbox: Sandbox) -> None:
    from sandforge.runtime.agent import Workspace
    from sandforge.runtime.providers import ScriptedProvider

    caller = (
        "r = tool('doubler').double(args[0])\n"
        "context['memory'] = context.get('memory', 0) + r.value\n"
        "return context['memory']\n"
    )
    doubler = "return args[0] * 2\n"
    executed = sum(row["executed"] for row in sandbox._cluster().status())
    ws = Workspace(provider=ScriptedProvider([caller, doubler, caller, doubler]), sandbox=sandbox, log=False)
    try:
        out = ws.call("calc", "add", 3)
        assert out.ok, (out.error_type, out.error_message)
        assert out.value == 6
        assert ws.call("calc", "add", 1).value == 8  # the committed context is the next call's
    finally:
        ws.close()
    assert sum(row["executed"] for row in sandbox._cluster().status()) == executed + 4  # every execution ran there


def test_executors_of_one_process_share_the_connection(cluster: LocalCluster, sandbox: Sandbox) -> None:
    state = cluster.state()
    assert state is not None
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1)) as other:
        assert other.execute(ExecutionRequest(code="return 7")).value == 7
    assert sandbox.execute(ExecutionRequest(code="return 8")).value == 8  # closing the other left ours open


def test_sandforge_cluster_status_shows_the_nodes(
    cluster: LocalCluster, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from sandforge.runtime.cli import main

    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(cluster.root.parent))
    result = CliRunner().invoke(main, ["cluster", "status", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert len(payload["nodes"]) == 3
    assert all("pools" in row for row in payload["nodes"])
    text = CliRunner().invoke(main, ["cluster", "status"])
    assert text.exit_code == 0 and "backends=runc" in text.output and "warm: subprocess" in text.output
    assert sandbox.execute(ExecutionRequest(code="return 9")).value == 9


def test_executions_take_the_direct_channel_and_ray_calls_when_it_is_unreachable(
    cluster: LocalCluster, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a node is driven over its host's direct channel; a caller that cannot reach it (a Ray Client
    outside the cluster's network, here: every connection refused) and a caller configured for Ray's calls
    drive the same hosts through Ray's actor calls, with the same results."""
    from sandforge.sandbox.cluster import channel as channel_mod

    request = ExecutionRequest(code="context['n'] += 1\nreturn 3", context={"n": 1})
    assert sandbox.execute(request).ok
    assert any(n.channel is not None for n in sandbox._cluster().nodes())
    state = cluster.state()
    assert state is not None
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1, cluster_channel="ray")) as by_ray:
        outcome = by_ray.execute(request)
        assert outcome.ok and outcome.value == 3 and outcome.context == {"n": 2}
        assert all(n.channel is None for n in by_ray._cluster().nodes())

    def unreachable(self: channel_mod.Channel) -> Any:
        raise channel_mod.ChannelError("cannot reach it (test)")

    monkeypatch.setattr(channel_mod.Channel, "connect", unreachable)
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1)) as fallback:
        for _ in range(3):
            outcome = fallback.execute(request)
            assert outcome.ok and outcome.value == 3 and outcome.context == {"n": 2}
        nodes = fallback._cluster().nodes()
        assert any(n.checked for n in nodes) and all(n.channel is None for n in nodes)


def test_concurrent_executions_with_frames_share_the_channels_without_crossing(sandbox: Sandbox) -> None:
    """Twelve executions at once, each making nested calls whose answers depend on its own arguments: every
    program gets its own answers back (no frame or answer crosses between executions sharing a node's
    connections), and afterwards each node keeps at most one idle connection per call that was in flight."""

    def bridge(frame: CallFrame) -> dict[str, Any]:
        return {"status": "ok", "value": frame.args[0] * 10}

    code = "a = tool('t').times(context['i']).value\nb = tool('t').times(context['i'] + 1).value\nreturn [a, b]"
    results: dict[int, Any] = {}

    def run(i: int) -> None:
        outcome = sandbox.execute(ExecutionRequest(code=code, context={"i": i}), bridge=bridge)
        results[i] = outcome.value if outcome.ok else outcome.error_message

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == {i: [i * 10, (i + 1) * 10] for i in range(12)}
    channels = [n.channel for n in sandbox._cluster().nodes() if n.channel is not None]
    assert channels and all(len(c._idle) <= 12 for c in channels)
    assert sum(len(c._idle) for c in channels) >= 1  # connections are kept for the next calls
