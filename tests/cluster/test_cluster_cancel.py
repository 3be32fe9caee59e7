"""A cancelled cluster execution ends on its node (issue 24's contract across issue 22's executor): the caller's
task gets ``CancelledError`` at once, and the node is told to end the execution, so it does not run on to its
limit holding a worker, a thread and a slot. Host-level tests need no cluster; the last one runs on a real one."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from sandforge.sandbox import (
    AsyncSandbox,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    Sandbox,
    SandboxConfig,
)
from sandforge.sandbox.cluster.executor import Node, RayExecutor, Ticket
from sandforge.sandbox.cluster.host import SandboxHost
from sandforge.sandbox.cluster.local import LocalCluster
from sandforge.sandbox.cluster.wire import outcome_from_wire, request_to_wire
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.exchange import CANCELLED_MESSAGE
from tests.cluster.conftest import SHARED_CLUSTER

pytestmark = SHARED_CLUSTER  # its last test runs on the two nodes the package shares

SPIN = "while True:\n    pass"
CALL_THEN_SPIN = "tool('other').go()\nwhile True:\n    pass"
LONG = Limits(timeout_s=120)
SOON_S = 20.0  # far below the program's own limit: only a kill ends it by then


def call(code: str, exec_id: str, kinds: list[str] | None) -> dict[str, Any]:
    message, blobs = request_to_wire(ExecutionRequest(code=code, limits=LONG))
    return {"id": exec_id, "message": message, "backend": "subprocess", "blobs": blobs, "kinds": kinds}


def until(check: Any, timeout_s: float = SOON_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_cancel_kills_an_execution_running_on_its_call_thread(host: SandboxHost) -> None:
    answer: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: answer.append(host.start(call(SPIN, "spin", None))))
    runner.start()
    assert until(lambda: (run := host.live.get("spin")) is not None and run.worker is not None)
    started = time.monotonic()
    host.cancel("spin")
    runner.join(SOON_S)
    assert not runner.is_alive(), "the cancelled execution ran on"
    assert time.monotonic() - started < SOON_S
    outcome = outcome_from_wire(answer[0], ContextSnapshot())
    assert not outcome.ok and outcome.context is None  # killed: nothing of it to commit
    assert host.status()["in_flight"] == 0


def test_a_cancel_ends_an_execution_parked_on_a_frame(host: SandboxHost) -> None:
    event = host.start(call(CALL_THEN_SPIN, "parked", ["call"]))
    assert event["kind"] == "call"  # the program waits for its caller's answer
    run = host.live["parked"]
    host.cancel("parked")
    assert until(lambda: run.worker is None), "the parked execution did not end"
    late = host.step("parked", {"status": "ok", "value": 1})  # a caller that answers anyway finds nothing
    assert late["kind"] == "done" and "no such execution" in late["outcome"]["error_message"]
    assert host.status()["in_flight"] == 0


def test_a_cancel_that_overtakes_its_start_keeps_it_from_running(host: SandboxHost) -> None:
    pool = host.sandbox.pool("subprocess")
    assert pool.wait_ready(1, timeout=30)
    hits = pool.stats["warm_hits"] + pool.stats["cold_starts"]
    host.cancel("early")  # a threaded actor may run the cancel first
    event = host.start(call(SPIN, "early", None))
    assert event["kind"] == "done" and event["outcome"]["error_message"] == CANCELLED_MESSAGE
    assert pool.stats["warm_hits"] + pool.stats["cold_starts"] == hits  # no sandbox was taken for it
    assert "early" not in host.cancelled  # remembered only until it came


def test_a_worker_handed_to_a_cancelled_run_is_destroyed_not_used(host: SandboxHost) -> None:
    """The cancel lands while the run waits for its worker: the worker it then gets is destroyed at once."""
    gate, entered = threading.Event(), threading.Event()
    original = host.sandbox._acquire

    def slow_acquire(*args: Any) -> Any:
        entered.set()
        assert gate.wait(SOON_S)
        return original(*args)

    host.sandbox._acquire = slow_acquire  # type: ignore[method-assign]
    answer: list[dict[str, Any]] = []
    try:
        runner = threading.Thread(target=lambda: answer.append(host.start(call(SPIN, "acq", None))))
        runner.start()
        assert entered.wait(SOON_S)
        host.cancel("acq")
        gate.set()
        runner.join(SOON_S)
    finally:
        del host.sandbox._acquire
    assert not runner.is_alive()
    assert answer[0]["kind"] == "done" and CANCELLED_MESSAGE in answer[0]["outcome"]["error_message"]


def test_a_ticket_cancelled_before_binding_refuses_the_start() -> None:
    sent: list[str] = []

    class Actor:
        class cancel:  # the shape of a Ray actor method
            @staticmethod
            def remote(exec_id: str) -> None:
                sent.append(exec_id)

    ticket = Ticket()
    ticket.cancel()
    assert not ticket.bind(Actor, "x")  # not started: nothing to tell a node
    assert sent == []
    bound = Ticket()
    assert bound.bind(Actor, "y")
    bound.cancel()
    bound.cancel()
    assert sent == ["y"]  # told once


# --- on a real cluster ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cancelled_awaited_cluster_execution_ends_on_its_node(cluster: LocalCluster) -> None:
    state = cluster.state()
    assert state is not None
    config = SandboxConfig(cluster=state.address, pool_size=1)

    async def main(sb: Sandbox) -> float:
        executor = sb._cluster()
        async with AsyncSandbox(sb) as asb:  # its close waits for the caller's thread that waits for the node
            task = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=LONG)))
            loop = asyncio.get_running_loop()
            on_node = await loop.run_in_executor(None, until, lambda: any(r["in_flight"] for r in executor.status()))
            assert on_node, "the execution never reached the node"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic()

    with Sandbox(config) as sb:
        cancelled_at = asyncio.run(main(sb))
        executor = sb._cluster()
        assert until(lambda: not any(r["in_flight"] for r in executor.status())), "the node ran it on"
        assert time.monotonic() - cancelled_at < SOON_S  # not the program's own 120 s limit
        assert sb.execute(ExecutionRequest(code="return 5")).value == 5  # the node serves on


def test_a_cancelled_execution_is_never_moved_to_another_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node lost after its caller cancelled: nobody waits for the execution, so it is not run again elsewhere
    (round 8: such a retry outlived its test and held the process's Ray connection lock reconnecting)."""
    ex = RayExecutor(SandboxConfig(cluster="127.0.0.1:1"))
    node = Node("n1", frozenset({"subprocess"}), actor=None)
    picks: list[list[str]] = []
    ticket = Ticket()

    def pick(backend: str, env_id: str | None, avoid: list[str] | None = None) -> Node:
        picks.append(list(avoid or []))
        return node

    def attempt(*args: Any) -> ExecutionOutcome:
        ticket.cancel()  # the caller cancels while its node is being lost
        outcome = ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, "lost (test)", retriable=True)
        outcome.metadata["cluster_node_lost"] = True
        return outcome

    monkeypatch.setattr(ex, "_pick", pick)
    monkeypatch.setattr(ex, "_attempt", attempt)
    outcome = ex.execute(ExecutionRequest(code="return 1"), ticket=ticket)
    assert not outcome.ok and picks == [[]]
