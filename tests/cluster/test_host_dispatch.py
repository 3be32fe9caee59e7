"""The dispatch path's pieces without a cluster (issue 22, round 4): a sandbox host runs an execution that has no
bridge on the calling thread and parks frames of one that has, a malformed call is a typed failure, and a
driver whose cluster's head restarted reconnects instead of asking the new GCS for its node table (which makes
Ray abort the whole process)."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from sandforge.sandbox import ExecutionRequest, SandboxConfig
from sandforge.sandbox.cluster import executor as executor_mod
from sandforge.sandbox.cluster.executor import ClusterUnavailable, RayExecutor
from sandforge.sandbox.cluster.host import SandboxHost
from sandforge.sandbox.cluster.wire import outcome_from_wire, request_to_wire
from sandforge.sandbox.context import ContextSnapshot


def call(request: ExecutionRequest, kinds: list[str] | None, exec_id: str = "e1") -> dict[str, Any]:
    message, blobs = request_to_wire(request)
    return {"id": exec_id, "message": message, "backend": "subprocess", "blobs": blobs, "kinds": kinds}


def test_without_a_bridge_the_execution_runs_on_the_calling_thread(host: SandboxHost) -> None:
    seen: list[str] = []
    original = host.sandbox.outline

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        assert host.status()["in_flight"] == 1  # counted while it runs, though not parked in ``runs``
        return original(*args, **kwargs)

    host.sandbox.outline = spy  # type: ignore[method-assign]
    try:
        request = ExecutionRequest(code="context['n'] += 1\nreturn 7", context={"n": 1})
        event = host.start(call(request, None))
    finally:
        del host.sandbox.outline
    assert event["kind"] == "done"
    outcome = outcome_from_wire(event, ContextSnapshot.coerce(request.context))
    assert outcome.ok and outcome.value == 7 and outcome.context == {"n": 2}
    assert seen == [threading.current_thread().name]  # no hand-off to another thread
    assert host.runs == {}  # nothing parked
    assert host.status()["in_flight"] == 0


def test_with_a_bridge_frames_are_parked_for_the_caller_and_answered_by_step(host: SandboxHost) -> None:
    request = ExecutionRequest(code="r = tool('t').go(2)\nreturn [r.ok, r.value]")
    event = host.start(call(request, ["call"], "e2"))
    assert event["kind"] == "call"
    assert event["frame"]["method"] == "go" and event["frame"]["args"] == [2]
    assert "e2" in host.runs
    event = host.step("e2", {"status": "ok", "value": 4})
    assert event["kind"] == "done"
    assert outcome_from_wire(event, ContextSnapshot()).value == [True, 4]
    assert "e2" not in host.runs
    # the thread that ran it is kept for the next execution with a bridge
    threads = {t.name for t in threading.enumerate() if t.name.startswith("sandforge-run")}
    event = host.start(call(ExecutionRequest(code="return tool('t').x().value"), ["call"], "e3"))
    assert host.step("e3", {"status": "ok", "value": 1})["kind"] == "done"
    assert {t.name for t in threading.enumerate() if t.name.startswith("sandforge-run")} == threads


@pytest.mark.parametrize("broken", [{}, {"id": "x"}, "not a dict", {"id": "x", "message": {}, "backend": "subprocess",
                                                                      "blobs": {}, "kinds": None}])  # fmt: skip
def test_a_malformed_call_is_a_typed_failure(host: SandboxHost, broken: Any) -> None:
    event = host.start(broken)
    assert event["kind"] == "done"
    assert event["outcome"]["error_type"] == "invalid_request"


def test_an_unknown_execution_is_unavailable_not_a_crash(host: SandboxHost) -> None:
    event = host.step("nope", {"status": "ok"})
    assert event["outcome"]["error_type"] == "sandbox_unavailable"


class FakeRay:
    """A driver's view of Ray: its GCS address and cluster id; ``nodes()`` stands for the query Ray aborts on."""

    def __init__(self, gcs_address: str, cluster_id: str) -> None:
        node = SimpleNamespace(gcs_address=gcs_address, cluster_id=cluster_id)
        self._private = SimpleNamespace(worker=SimpleNamespace(global_worker=SimpleNamespace(node=node)))
        self.shutdowns = 0

    def nodes(self) -> list[dict[str, Any]]:
        raise AssertionError("asked a restarted GCS for its node table: Ray would abort this process here")

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_driver_whose_head_is_gone_reconnects_instead_of_querying(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed: the head is gone
    ray = FakeRay(f"127.0.0.1:{port}", "old")
    ex = RayExecutor(SandboxConfig(cluster=f"127.0.0.1:{port}"))
    ex._ray = ray
    with pytest.raises(ClusterUnavailable, match="restarted or is unreachable"):
        ex._refresh(ray)
    assert ray.shutdowns == 1 and not ex._connected


def test_a_driver_whose_head_restarted_reconnects(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:  # a GCS port that answers, with another cluster id behind it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.setattr(executor_mod, "_gcs_cluster_id", lambda address: "new")
        ray = FakeRay(f"127.0.0.1:{port}", "old")
        assert not executor_mod._same_gcs(ray)
        ray_same = FakeRay(f"127.0.0.1:{port}", "new")
        assert executor_mod._same_gcs(ray_same)


def test_a_driver_without_a_gcs_address_to_compare_keeps_its_connection() -> None:
    assert executor_mod._same_gcs(SimpleNamespace())  # nothing to compare: no reconnect on every refresh


def test_an_address_nobody_listens_at_is_unavailable_once_its_connect_time_is_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found before ``ray.init``, whose one Ray Client attempt retries ~30 s whatever is at the address."""
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    with pytest.raises(ClusterUnavailable, match=r"cannot connect to the Ray cluster at ray://127\.0\.0\.1:\d+: "):
        executor_mod._wait_listening(f"ray://127.0.0.1:{port}", time.monotonic() + 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        executor_mod._wait_listening(f"127.0.0.1:{listener.getsockname()[1]}", time.monotonic())
    executor_mod._wait_listening("auto", time.monotonic())  # Ray's own discovery: nothing to probe
    lookups: list[object] = []

    def unresolvable(target: object, timeout: float) -> socket.socket:  # no resolver is asked: loopback only
        lookups.append(target)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(executor_mod.socket, "create_connection", unresolvable)
    with pytest.raises(ClusterUnavailable, match=r"at no-such-host\.invalid:6379: Name or service not known"):
        executor_mod._wait_listening("no-such-host.invalid:6379", time.monotonic() + 60)
    assert lookups == [("no-such-host.invalid", 6379)]  # a name that does not resolve is not asked again


class TableRay:
    """Ray's node table as a driver reads it (``ray.nodes()``), each node offering the subprocess backend."""

    def __init__(self, raylet_ports: dict[str, int]) -> None:
        self.table = [
            {"NodeID": node_id, "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port,
             "Resources": {f"{executor_mod.RESOURCE_PREFIX}subprocess": 1000}}
            for node_id, port in raylet_ports.items()
        ]  # fmt: skip

    def nodes(self) -> list[dict[str, Any]]:
        return self.table


def test_a_node_seen_lost_is_not_used_again_while_ray_lists_it_but_its_raylet_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray lists a dead node as alive until its health checks give up, so the refresh a loss triggers may list
    it again: a node this executor saw lost is used again only once its raylet accepts connections (its host
    restarted in place) or LOST_QUARANTINE_S has passed (Ray's table is trusted again); other nodes are
    admitted as listed."""
    monkeypatch.setattr(executor_mod.leftovers, "reap_in_background", lambda: None)  # no node ran here
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        gone = closed.getsockname()[1]  # nothing listens here once closed: a raylet that died
    with socket.socket() as raylet:
        raylet.bind(("127.0.0.1", 0))
        raylet.listen()
        ray = TableRay({"dead": gone, "restarted": raylet.getsockname()[1], "other": gone})
        ex = RayExecutor(SandboxConfig(cluster="ray://127.0.0.1:1"))  # a Ray Client address: no GCS to compare
        ex._host_actor = lambda ray, node_id, backends: None  # type: ignore[method-assign]
        for node_id in ("dead", "restarted"):
            ex._lost(executor_mod.Node(node_id, frozenset({"subprocess"}), actor=None))
        ex._refresh(ray)
        assert set(ex._nodes) == {"restarted", "other"}
        ex._lost_at["dead"] -= executor_mod.LOST_QUARANTINE_S
        ex._refresh(ray)
    assert set(ex._nodes) == {"dead", "restarted", "other"}
