"""The Ray executor: the caller's side of executions that run on a cluster's nodes.

``Sandbox(SandboxConfig(cluster=ADDRESS))`` sends each execution here. Everything but the execution stays
with the caller (guardrails, lifecycle, store, call log, egress broker): the executor picks a node, hands the
request to that node's sandbox host (``host.py``) and answers the nested frames the program sends back with
the caller's own bridge handler, on the caller's thread and within the execution's deadline. A node lost
mid-execution ends its calls as ``sandbox_unavailable`` (retriable); a lost connection to the cluster is
re-established on the next execution.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandforge.sandbox import leftovers
from sandforge.sandbox.cluster.channel import Channel, ChannelError
from sandforge.sandbox.cluster.host import MAX_RUNS, PROTOCOL, cancelled
from sandforge.sandbox.cluster.wire import Wire, WireError, outcome_from_wire, request_to_wire
from sandforge.sandbox.config import BACKENDS, SandboxConfig
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.exchange import BridgeHandler, DeclareHandler, serving, serving_deadline
from sandforge.sandbox.protocol import (
    BridgeReply,
    CallFrame,
    DeclareFrame,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
)

log = logging.getLogger(__name__)

NAMESPACE = "sandforge"
#: A node offers a backend by declaring this custom resource (``ray start --resources``), e.g.
#: ``{"sandforge_backend_subprocess": 1000}``; a node that declares none is not a sandbox host.
RESOURCE_PREFIX = "sandforge_backend_"
#: How long a call to a node may take beyond the execution's own limits before the node counts as lost.
GRACE_S = 15.0
#: How often the node table is refreshed from the cluster at most (a lost node triggers a refresh at once).
REFRESH_S = 5.0
#: How long connecting (again) to the cluster may take before executions fail as ``sandbox_unavailable``.
CONNECT_TIMEOUT_S = float(os.environ.get("SANDFORGE_CLUSTER_CONNECT_TIMEOUT_S", "120"))
#: How long the first message over a node's direct channel may take before the caller uses Ray's calls.
CHANNEL_CHECK_S = 5.0
#: How long a driver's check that its GCS still listens may take.
GCS_PROBE_S = 2.0


#: How many times an execution whose node was lost before it sent anything moves to another node.
LOST_NODE_RETRIES = 2
#: How long a node this executor saw lost must show a live raylet before it is used again. Ray lists a dead
#: node as alive until its health checks have missed enough (15-30 s by default, longer on a loaded machine),
#: so the refresh a loss triggers may list it again; a node whose raylet still accepts connections (its host
#: actor restarted in place) is used again at once.
LOST_QUARANTINE_S = 60.0
#: How long that check of a lost node's raylet may take.
RAYLET_PROBE_S = 0.5


@dataclass
class _Shared:
    """The process's one Ray connection: which cluster, how many executors use it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    address: str | None = None
    users: int = 0


_SHARED = _Shared()


@dataclass
class _Progress:
    ticket: Ticket
    served: int = 0


class Ticket:
    """One cluster execution's cancellation: the caller's driver calls :meth:`cancel` when nobody waits for
    the answer any more (an awaiting task was cancelled); the node running it is told to end it, so it does not
    run on to its limit holding a worker. A cancel before the execution reached a node keeps it from starting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self._where: tuple[Any, str] | None = None  # (the node's actor, the execution's id)

    def bind(self, actor: Any, exec_id: str) -> bool:
        """The execution is about to start on ``actor``; False if it was cancelled already (do not start)."""
        with self._lock:
            self._where = (actor, exec_id)
            return not self.cancelled

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            where = self._where
        if where is not None:
            actor, exec_id = where
            with contextlib.suppress(Exception):  # a lost node ends its executions anyway
                actor.cancel.remote(exec_id)  # not waited for: the caller is gone


class ClusterUnavailable(Exception):
    """The cluster cannot be reached, or offers no node for the request."""

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass
class Node:
    """What the executor knows of one node: its host actor, its backends, its load as seen from here."""

    node_id: str
    backends: frozenset[str]
    actor: Any
    in_flight: int = 0
    #: warm sandboxes by (backend, env_id), as the node last reported them
    warm: dict[tuple[str, str | None], int] = field(default_factory=dict)
    #: digests of the large context texts this node holds (sent once)
    known: set[str] = field(default_factory=set)
    instance: str | None = None
    #: the host's direct channel (``channel.py``); None: not asked yet, or unreachable (``checked``)
    channel: Channel | None = None
    checked: bool = False
    check_lock: threading.Lock = field(default_factory=threading.Lock)

    def drop(self) -> None:
        """The executor forgets this node: its idle connections close (calls in flight end as they will)."""
        if self.channel is not None:
            self.channel.close()


def config_digest(config: SandboxConfig) -> str:
    """Hosts are per node and per configuration: two callers with different limits get different hosts."""
    text = config.model_dump_json(exclude={"cluster", "cluster_channel"})
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def node_backends(resources: dict[str, float]) -> frozenset[str]:
    return frozenset(name for name in BACKENDS if resources.get(f"{RESOURCE_PREFIX}{name}", 0) > 0)


def ray_address(address: str) -> str:
    """What ``ray.init`` takes: ``ray://HOST:PORT`` (Ray Client), ``HOST:PORT`` (the GCS) or ``auto``."""
    return address


class RayExecutor:
    """Dispatches executions to the sandbox hosts of a Ray cluster."""

    def __init__(self, config: SandboxConfig) -> None:
        if not config.cluster:
            raise ValueError("RayExecutor needs SandboxConfig.cluster")
        self.config = config
        self.address = config.cluster
        self._host_config = config.model_dump(mode="json", exclude={"cluster", "cluster_channel"})
        self._digest = config_digest(config)
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {}
        self._lost_at: dict[str, float] = {}  # node id -> when this executor saw it lost (LOST_QUARANTINE_S)
        self._refreshed = 0.0
        self._connected = False
        self._rr = itertools.count()
        self._ray: Any = None
        self._counted = False

    # --- connection and nodes -------------------------------------------------------------------------

    def _connect(self) -> Any:
        """Ray, connected (again, after a lost connection). One process has one Ray connection: executors
        of the same cluster share it (a service's tenants each have a Sandbox), and it is closed with the
        last of them."""
        if self._connected and self._ray is not None and self._ray.is_initialized():
            return self._ray
        try:
            import ray
        except ImportError:
            raise ClusterUnavailable(
                "the Ray executor needs Ray: pip install 'sandforge[cluster]'", retriable=False
            ) from None
        self._ray = ray
        with _SHARED.lock:
            if not (ray.is_initialized() and _SHARED.address == self.address):
                if ray.is_initialized() and _SHARED.address is not None:
                    raise ClusterUnavailable(
                        f"this process is connected to the Ray cluster at {_SHARED.address}; one cluster per "
                        f"process (asked for {self.address})", retriable=False,
                    )  # fmt: skip
                self._init(ray)
                _SHARED.address = self.address
            if not self._counted:
                _SHARED.users += 1
                self._counted = True
        self._connected = True
        self._nodes, self._refreshed = {}, 0.0
        return ray

    def _init(self, ray: Any) -> None:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _reload_auth()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        _wait_listening(self.address, deadline)
        while True:  # Ray Client gives up after ~30 s; a loaded head may take longer to start our session
            try:
                ray.init(
                    address=ray_address(self.address), namespace=NAMESPACE, logging_level=logging.WARNING,
                    log_to_driver=False, configure_logging=False,
                )  # fmt: skip
                return
            except Exception as exc:
                with contextlib.suppress(Exception):
                    ray.shutdown()
                if time.monotonic() > deadline or not _transient(exc):
                    raise ClusterUnavailable(
                        f"cannot connect to the Ray cluster at {self.address}: {_first_line(exc)}"
                    ) from None

    def _disconnect(self) -> None:
        """The connection is broken: drop it (for every executor of the process; each reconnects)."""
        self._connected = False
        self._forget(self._nodes.values())
        self._nodes = {}
        with _SHARED.lock:
            _SHARED.address = None
            if self._ray is not None:
                with contextlib.suppress(Exception):
                    self._ray.shutdown()

    def nodes(self, *, refresh: bool = False) -> list[Node]:
        """The cluster's live sandbox-host nodes (each with its host actor, created on first sight)."""
        with self._lock:
            for attempt in range(2):  # a connection found broken is made again once, at once
                ray = self._connect()
                if not (refresh or time.monotonic() - self._refreshed > REFRESH_S or not self._nodes):
                    break
                try:
                    self._refresh(ray)
                    break
                except ClusterUnavailable:
                    if attempt:
                        raise
            return list(self._nodes.values())

    def _refresh(self, ray: Any) -> None:
        if not self.address.startswith("ray://") and not _same_gcs(ray):
            self._disconnect()  # the head restarted under this driver: connect afresh (nodes() retries once)
            raise ClusterUnavailable(f"the Ray cluster at {self.address} restarted or is unreachable")
        try:
            listed = ray.nodes()
        except Exception as exc:
            self._disconnect()
            raise ClusterUnavailable(f"lost the Ray cluster at {self.address}: {exc}") from exc
        alive: dict[str, Node] = {}
        now = time.monotonic()
        self._lost_at = {n: t for n, t in self._lost_at.items() if now - t < LOST_QUARANTINE_S}
        for info in listed:
            backends = node_backends(info.get("Resources", {}))
            if not info.get("Alive") or not backends:
                continue
            node_id = info["NodeID"]
            if node_id in self._lost_at and not _raylet_listens(info):
                continue  # seen lost, and its raylet is gone: Ray's table has not caught up yet
            self._lost_at.pop(node_id, None)
            node = self._nodes.get(node_id) or Node(node_id, backends, self._host_actor(ray, node_id, backends))
            node.backends = backends
            alive[node_id] = node
        self._forget(n for n in self._nodes.values() if n.node_id not in alive)
        self._nodes, self._refreshed = alive, time.monotonic()

    @staticmethod
    def _forget(nodes: Iterable[Node]) -> None:
        for node in list(nodes):
            node.drop()

    def _host_actor(self, ray: Any, node_id: str, backends: frozenset[str]) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from sandforge.sandbox.cluster.host import SandboxHost

        prewarm = [self.config.backend] if self.config.backend in backends else []
        return (
            ray.remote(SandboxHost)
            .options(
                name=f"sandforge-host-v{PROTOCOL}-{node_id[:16]}-{self._digest}",
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                max_restarts=-1,
                max_task_retries=0,
                max_concurrency=MAX_RUNS,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            )
            .remote(self._host_config, prewarm)
        )

    def _pick(self, backend: str, env_id: str | None, avoid: list[str] | None = None) -> Node:
        """The idlest node offering ``backend``; among equally busy ones, one with a warm sandbox for it."""
        nodes = [n for n in self.nodes() if backend in n.backends and n.node_id not in (avoid or ())]
        if not nodes:
            raise ClusterUnavailable(f"no node of the cluster offers the {backend!r} backend", retriable=False)
        turn = next(self._rr)
        with self._lock:
            best = min(
                nodes,
                key=lambda n: (n.in_flight, 0 if n.warm.get((backend, env_id), 1) > 0 else 1,
                               (hash(n.node_id) + turn) % 997),
            )  # fmt: skip
            best.in_flight += 1
        return best

    def _lost(self, node: Node) -> None:
        with self._lock:
            self._nodes.pop(node.node_id, None)
            self._lost_at[node.node_id] = time.monotonic()
            self._refreshed = 0.0
        node.drop()
        leftovers.reap_in_background()  # what the lost node's sandboxes left on this machine, if it ran here

    # --- executions ---------------------------------------------------------------------------------------

    def execute(
        self, request: ExecutionRequest, *, backend: str | None = None, bridge: BridgeHandler | None = None,
        ticket: Ticket | None = None,
    ) -> ExecutionOutcome:  # fmt: skip
        """Run ``request`` on a node; never raises for anything the cluster or the program does. ``ticket``
        cancels it (see :class:`Ticket`): the answer is then a ``cancelled`` failure nobody reads.

        A node lost before the program sent the caller anything (no nested call, declaration or fetch was
        served: nothing happened that the caller saw) is replaced by another node, up to ``LOST_NODE_RETRIES``
        times; once a frame was served, the loss is the caller's to handle (``sandbox_unavailable``,
        retriable, nothing to commit)."""
        name = backend or self.config.backend
        ticket = ticket or Ticket()
        request = _within_caller(request)
        env_id = request.environment.env_id if request.environment is not None else None
        lost: list[str] = []
        while True:
            try:
                node = self._pick(name, env_id, avoid=lost)
            except ClusterUnavailable as exc:
                return ExecutionOutcome.failure(
                    ErrorType.SANDBOX_UNAVAILABLE, str(exc), retriable=exc.retriable, backend=name,
                    metadata={"cluster_lost": lost} if lost else {},
                )  # fmt: skip
            progress = _Progress(ticket)
            outcome = self._attempt(node, request, name, bridge, progress)
            if ticket.cancelled:  # nobody waits for it: never moved to another node
                return outcome
            if outcome.metadata.get("cluster_node_lost") and not progress.served and len(lost) < LOST_NODE_RETRIES:
                lost.append(node.node_id)
                continue
            if lost:
                outcome.metadata["cluster_lost"] = lost
            return outcome

    def _attempt(
        self, node: Node, request: ExecutionRequest, name: str, bridge: BridgeHandler | None, progress: _Progress
    ) -> ExecutionOutcome:
        try:
            outcome = self._drive(node, request, name, bridge, progress)
        except Exception as exc:  # ClusterUnavailable, or anything else Ray raises about the node
            if not isinstance(exc, ClusterUnavailable):
                log.warning("cluster node %s failed: %s", node.node_id[:12], exc)
            self._lost(node)
            message = (
                str(exc)
                if isinstance(exc, ClusterUnavailable)
                else f"cluster node {node.node_id[:12]} failed: {_first_line(exc)}"
            )
            outcome = ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, message, retriable=True, backend=name)
            outcome.metadata["cluster_node_lost"] = True
        finally:
            with self._lock:
                node.in_flight -= 1
        outcome.metadata["cluster_node"] = node.node_id
        return outcome

    def _drive(
        self, node: Node, request: ExecutionRequest, backend: str, bridge: BridgeHandler | None, progress: _Progress
    ) -> ExecutionOutcome:
        base = ContextSnapshot.coerce(request.context)
        message, blobs = request_to_wire(request, node.known)
        exec_id = uuid.uuid4().hex
        kinds = _kinds(bridge)
        budget = request.limits.timeout_s + self.config.spawn_timeout_s + GRACE_S
        call = {"id": exec_id, "message": message, "backend": backend, "blobs": blobs, "kinds": kinds}
        if not progress.ticket.bind(node.actor, exec_id):
            return cancelled(backend)
        event = self._exchange(node, budget, "start", call)
        if event.get("kind") == "missing":  # the node lost texts it had (restarted): send them all once more
            node.known.clear()
            message, blobs = request_to_wire(request, None)
            call.update(message=message, blobs=blobs)
            event = self._exchange(node, budget, "start", call)
        while event.get("kind") != "done":
            if progress.ticket.cancelled:  # nobody waits: serve no more frames (the node ends the execution)
                return cancelled(backend)
            progress.served += 1  # from here on the caller saw the program act: never re-run elsewhere
            answer = _answer(bridge, event)
            event = self._exchange(node, budget, "step", exec_id, answer)
        node.known.update(blobs)
        if "warm" in event:
            node.warm[(backend, request.environment.env_id if request.environment else None)] = int(event["warm"])
        node.instance = event.get("instance")
        try:
            return outcome_from_wire(event, base)
        except (WireError, ValueError) as exc:
            return ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, f"node {node.node_id[:12]} answered a malformed outcome: {exc}",
                retriable=True, backend=backend,
            )  # fmt: skip

    def _exchange(self, node: Node, timeout_s: float, method: str, *args: Any) -> Wire:
        """Call the node's host's ``method``: over its direct channel where the caller reaches it, else as a
        Ray actor call. Either way a lost node or a late answer is ClusterUnavailable."""
        channel = self._channel(node, timeout_s)
        if channel is None:
            return self._call(node, getattr(node.actor, method).remote(*args), timeout_s)
        try:
            return channel.call({"op": method, "args": list(args)}, timeout_s)
        except ChannelError as exc:
            raise (_late(node, timeout_s) if exc.timeout else _gone(node, str(exc))) from None

    def _channel(self, node: Node, timeout_s: float) -> Channel | None:
        """The node's direct channel, asked for (through Ray) and tried once; None: use Ray's actor calls."""
        if node.checked or self.config.cluster_channel == "ray":
            return node.channel
        with node.check_lock:
            if node.checked:
                return node.channel
            info = self._call(node, node.actor.channel.remote(), timeout_s)
            channel = None
            try:
                address = (str(info["host"]), int(info["port"]))
                secret = bytes(info["secret"])
                channel = Channel(address, secret)
                channel.call({"op": "ping"}, CHANNEL_CHECK_S)
            except (KeyError, TypeError, ValueError, ChannelError) as exc:
                log.info("node %s: no direct channel (%s); using Ray's actor calls", node.node_id[:12], exc)
                if channel is not None:
                    channel.close()
                channel = None
            node.channel, node.checked = channel, True
            return channel

    def _call(self, node: Node, ref: Any, timeout_s: float) -> Wire:
        ray = self._ray
        try:
            event: Wire = ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False)
            raise _late(node, timeout_s) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise _gone(node, _first_line(exc)) from None
        except (ConnectionError, ray.exceptions.RaySystemError) as exc:
            self._disconnect()
            raise ClusterUnavailable(f"lost the Ray cluster at {self.address}: {_first_line(exc)}") from None
        if not isinstance(event, dict):
            raise ClusterUnavailable(f"cluster node {node.node_id[:12]} answered {type(event).__name__}")
        return event

    # --- status ----------------------------------------------------------------------------------------

    def status(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Each node's id, backends and its host's pools and load (``sandforge cluster status``)."""
        nodes = self.nodes(refresh=True)
        refs = [n.actor.status.remote() for n in nodes]
        rows: list[dict[str, Any]] = []
        for node, ref in zip(nodes, refs, strict=True):
            row: dict[str, Any] = {"node_id": node.node_id, "backends": sorted(node.backends)}
            try:
                row.update(self._ray.get(ref, timeout=timeout_s))
            except Exception as exc:
                row["error"] = _first_line(exc)
            rows.append(row)
        return rows

    def close(self) -> None:
        """Let go of the connection; the last executor of the process closes it (the cluster and its hosts
        live on for other callers)."""
        with self._lock, _SHARED.lock:
            self._forget(self._nodes.values())
            self._connected, self._nodes = False, {}
            if self._counted:
                self._counted = False
                _SHARED.users -= 1
                if _SHARED.users == 0 and self._ray is not None:
                    _SHARED.address = None
                    with contextlib.suppress(Exception):
                        self._ray.shutdown()


def _reload_auth() -> None:
    """Ray reads RAY_AUTH_MODE and the token when it is first imported; a caller that set them later (or
    changed the token file) must have them read again before connecting."""
    try:
        raylet: Any = importlib.import_module("ray._raylet")
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # another Ray version: the settings of import time apply
        log.debug("could not reload Ray's authentication settings", exc_info=True)


def _same_gcs(ray: Any) -> bool:
    """Is the GCS this driver was connected to still the one answering at its address? A driver (a ``HOST:PORT``
    connection) whose head restarted is aborted by Ray itself (a failed check, the whole process ends) on its
    next cluster-state query; the cluster id is compared first, on a fresh GCS client (about 1 ms)."""
    try:
        node = ray._private.worker.global_worker.node
        address, expected = str(node.gcs_address), node.cluster_id
    except Exception:  # not a driver of this Ray version: nothing to compare, keep the connection
        log.debug("no GCS address or cluster id to compare", exc_info=True)
        return True
    target = _socket_address(address)
    if target is None:
        return True
    if not _accepts(target, GCS_PROBE_S):  # a fresh client would wait ~40 s for a GCS that does not listen
        return False
    try:
        return bool(_gcs_cluster_id(address) == expected)
    except Exception:  # gone, or (re)starting: connect afresh rather than risk the abort
        log.debug("could not compare the GCS's cluster id", exc_info=True)
        return False


def _gcs_cluster_id(address: str) -> Any:
    """The id of the cluster whose GCS answers at ``address`` (a fresh client: it fetches the id on connect)."""
    raylet: Any = importlib.import_module("ray._raylet")
    return raylet.GcsClient(address=address).cluster_id


def _accepts(target: tuple[str, int], timeout_s: float) -> bool:
    """Whether something accepts a connection at ``target`` within ``timeout_s``."""
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return True
    except OSError:
        return False


def _raylet_listens(info: dict[str, Any]) -> bool:
    """Whether the raylet of a node in Ray's table accepts connections (True where the table names none)."""
    host, port = info.get("NodeManagerAddress"), info.get("NodeManagerPort")
    if not isinstance(host, str) or not isinstance(port, int) or not port:
        return True
    return _accepts((host, port), RAYLET_PROBE_S)


def _socket_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[IPV6]:PORT`` or ``ray://HOST:PORT`` as what a socket connects to; None for another form
    (``auto``: Ray finds the cluster itself)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if sep and port.isdigit() else None


def _wait_listening(address: str, deadline: float) -> None:
    """Wait until something listens at ``address`` (``auto`` is Ray's to find). One ``ray.init`` of a Ray Client
    retries ~30 s whatever is there; a port nobody listens on is known in a millisecond, and a head that is still
    starting is waited for until ``deadline`` (``SANDFORGE_CLUSTER_CONNECT_TIMEOUT_S``)."""
    target = _socket_address(address)
    if target is None:
        return
    while True:
        try:
            with socket.create_connection(target, timeout=2.0):
                return
        except OSError as exc:
            if isinstance(exc, socket.gaierror) or time.monotonic() > deadline:  # a name that does not resolve: now
                raise ClusterUnavailable(
                    f"cannot connect to the Ray cluster at {address}: {exc.strerror or type(exc).__name__}"
                ) from None
            time.sleep(0.2)


def _transient(exc: BaseException) -> bool:
    """A connection failure worth retrying (not a refused token or a malformed address)."""
    text = str(exc).lower()
    return isinstance(exc, (ConnectionError, TimeoutError)) and "auth" not in text and "token" not in text


def _late(node: Node, timeout_s: float) -> ClusterUnavailable:
    """The node did not answer in time (through its channel or Ray's call alike)."""
    return ClusterUnavailable(
        f"cluster node {node.node_id[:12]} did not answer within {timeout_s:g}s; its execution is lost"
    )


def _gone(node: Node, detail: str) -> ClusterUnavailable:
    """The node went away mid-call (its channel broke, or Ray lost its actor)."""
    return ClusterUnavailable(f"cluster node {node.node_id[:12]} was lost during the execution: {detail}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _within_caller(request: ExecutionRequest) -> ExecutionRequest:
    """A nested execution never outlives its caller's: the caller's remaining time becomes a wall budget
    (the node cannot see this thread's serving deadline)."""
    outer = serving_deadline()
    if outer is None:
        return request
    remaining = max(outer - time.monotonic(), 0.001)
    if request.wall_budget_s is not None and request.wall_budget_s <= remaining:
        return request
    return request.model_copy(update={"wall_budget_s": remaining})


def _kinds(bridge: BridgeHandler | None) -> list[str] | None:
    if bridge is None:
        return None
    kinds = ["call"]
    if isinstance(bridge, DeclareHandler):
        kinds.append("declare")
    if getattr(bridge, "egress_parts", None) is not None or getattr(bridge, "egress", None) is not None:
        kinds.append("egress")
    return kinds


def _answer(bridge: BridgeHandler | None, event: Wire) -> Any:
    """The caller's bridge's answer to one frame the program sent from its node, within its deadline."""
    kind = event.get("kind")
    remaining = event.get("remaining_s")
    deadline = time.monotonic() + float(remaining) if isinstance(remaining, (int, float)) else None
    if bridge is None:
        return BridgeReply.error("nested_calls_unavailable", "this execution has no agent to delegate to").wire()
    try:
        with serving(deadline):
            if kind == "call":
                return BridgeReply.of(bridge(CallFrame.model_validate(event["frame"]))).wire()
            if kind == "declare" and isinstance(bridge, DeclareHandler):
                return BridgeReply.of(bridge.declare(DeclareFrame.model_validate(event["frame"]))).wire()
            if kind == "fetch":
                return _fetch(bridge, bytes(event["request"]), deadline or time.monotonic())
    except Exception:  # a bridge bug must not end the execution: the program gets a typed failure
        log.exception("the caller's bridge failed to answer a frame from the cluster")
    return None


def _fetch(bridge: BridgeHandler, request: bytes, deadline: float) -> dict[str, bytes | None]:
    parts = getattr(bridge, "egress_parts", None)
    if parts is not None:
        reply, body = parts(request, deadline)
        return {"reply": reply, "body": body}
    return {"reply": bridge.egress(request, deadline), "body": None}  # type: ignore[attr-defined]


__all__ = ["NAMESPACE", "RESOURCE_PREFIX", "ClusterUnavailable", "Node", "RayExecutor", "node_backends"]
