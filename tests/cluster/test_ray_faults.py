"""Faults on a real three-node local cluster (issue 22): a crashed sandbox host is restarted and refills its
pool; a node killed during executions ends its in-flight calls as retriable ``sandbox_unavailable`` with nothing
committed, the other nodes keep serving and nothing of its sandboxes is left on the machine; the head
restarted, the executor reconnects. The order matters (the head restart is last): one cluster for the module."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Sandbox, SandboxConfig, leftovers
from sandforge.sandbox.cluster.channel import Channel
from sandforge.sandbox.cluster.local import LocalCluster, NodeSpec
from sandforge.sandbox.protocol import CallFrame
from tests.cluster.conftest import start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from start_cluster(tmp_path_factory.mktemp("rayfaults"), [NodeSpec() for _ in range(3)])


@pytest.fixture(scope="module")
def sandbox(cluster: LocalCluster) -> Iterator[Sandbox]:
    state = cluster.state()
    assert state is not None
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1)) as sb:
        yield sb


def wait_for(check: Any, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("condition not reached in time")


def sandbox_processes_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def test_a_crashed_host_is_restarted_and_refills_its_pool(sandbox: Sandbox) -> None:
    first = sandbox.execute(ExecutionRequest(code="return 1"))
    assert first.ok, first.error_message
    rows = sandbox._cluster().status()
    victim = rows[0]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        row = next(r for r in sandbox._cluster().status() if r["node_id"] == victim["node_id"])
        ready = sum(p["ready"] for p in row.get("pools", []) if p["backend"] == "subprocess")
        return row if row.get("instance") not in (None, victim["instance"]) and ready >= 1 else None

    row = wait_for(restarted)
    assert row["pid"] != victim["pid"]
    assert row["node_id"] == victim["node_id"]  # restarted on its own node
    assert all(sandbox.execute(ExecutionRequest(code="return 2")).ok for _ in range(3))


class Parked:
    """A bridge that holds every execution in a nested call until released (so they are in flight)."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, frame: CallFrame) -> dict[str, Any]:
        self.entered.release()
        self.release.wait(timeout=120)
        return {"status": "ok", "value": 1}


def test_a_killed_node_ends_its_calls_as_retriable_and_the_others_keep_serving(
    cluster: LocalCluster, sandbox: Sandbox
) -> None:
    executor = sandbox._cluster()
    rows = executor.status()
    assert len(rows) == 3
    bridge = Parked()
    outcomes: list[ExecutionOutcome] = []
    code = "context['touched'] = True\nreturn tool('t').wait().value"

    def run() -> None:
        outcomes.append(sandbox.execute(ExecutionRequest(code=code, context={"touched": False}), bridge=bridge))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in threads:
        assert bridge.entered.acquire(timeout=180)  # three in flight, one per node (idle nodes first)
    in_flight = {r["node_id"]: r for r in executor.status()}
    assert all(r["in_flight"] == 1 for r in in_flight.values()), in_flight
    victim = next(iter(in_flight.values()))
    sandboxes = [p.pid for p in sandbox_processes_of(victim["pid"])]
    # the node dies as a machine would: its raylet and its Ray workers (the host among them) at once; its
    # sandboxes are left to what the system does about them
    ray_procs = [psutil.Process(victim["node_pid"])] + [
        p for p in psutil.Process(victim["node_pid"]).children() if p.name().startswith("ray::")
    ]
    for proc in ray_procs:
        proc.kill()
    time.sleep(1.0)
    bridge.release.set()
    for t in threads:
        t.join(timeout=300)
    lost = [o for o in outcomes if not o.ok]
    served = [o for o in outcomes if o.ok]
    assert len(lost) == 1 and len(served) == 2, [(o.status, o.error_message) for o in outcomes]
    assert lost[0].error_type is ErrorType.SANDBOX_UNAVAILABLE
    assert lost[0].retriable
    assert lost[0].context is None  # nothing to commit
    assert lost[0].metadata["cluster_node"] == victim["node_id"]
    assert all(o.context == {"touched": True} for o in served)
    # the other nodes keep serving, and the lost node is never chosen again
    after = [sandbox.execute(ExecutionRequest(code="return 3")) for _ in range(4)]
    assert all(o.ok for o in after), [o.error_message for o in after]
    assert victim["node_id"] not in {o.metadata["cluster_node"] for o in after}
    # nothing of the killed node's sandboxes is left on the machine
    wait_for(lambda: not any(psutil.pid_exists(pid) for pid in sandboxes), 60)
    leftovers.reap(containers=False)
    assert not [item for item in leftovers.find(containers=False)[0]]


def test_an_unreachable_host_is_retriable_and_the_next_execution_succeeds(
    cluster: LocalCluster, sandbox: Sandbox
) -> None:
    """What the lifecycle sees: the lost execution is retriable (its lane retries it), and the retry is
    served (the node is looked up afresh: a new handle to its host)."""
    first = sandbox.execute(ExecutionRequest(code="return 4"))
    assert first.ok
    node = next(n for n in sandbox._cluster().nodes() if n.node_id == first.metadata["cluster_node"])
    for other in sandbox._cluster().nodes():
        other.in_flight = 0 if other is node else 5  # the broken node is the idlest: it is picked first
    # its host cannot be reached, over its channel or through Ray: the call fails as a lost node, before anything
    # was served (the channel's port now refuses: its listener is closed)
    node.actor = None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    node.channel, node.checked = Channel(dead, b"\0" * 32), True
    moved = sandbox.execute(ExecutionRequest(code="return 4"))
    assert moved.ok, moved.error_message  # run again on another node: nothing of it had reached the caller
    assert moved.metadata["cluster_lost"] == [node.node_id]
    assert moved.metadata["cluster_node"] != node.node_id
    for other in sandbox._cluster().nodes():
        other.in_flight = 0


def test_after_the_head_restarts_the_executor_reconnects(cluster: LocalCluster, sandbox: Sandbox) -> None:
    assert sandbox.execute(ExecutionRequest(code="return 5")).ok
    cluster.restart_head()
    outcome = wait_for(lambda: (o := sandbox.execute(ExecutionRequest(code="return 6"))).ok and o, 300)
    assert outcome.value == 6
    assert len(sandbox._cluster().status()) == len(cluster.state().nodes)  # type: ignore[union-attr]
