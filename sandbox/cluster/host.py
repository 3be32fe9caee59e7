"""The sandbox host: one long-lived Ray actor per node, owning that node's warm pools and backends.

The caller drives each execution (``start``, then ``step`` with each answer): when the program makes a nested
``tool()``/``delegate()`` call, declares a contract or fetches, the execution's thread on the node parks the
frame as an event, ``start``/``step`` returns it to the caller, and the caller's answer comes back with the
next ``step``. So nested calls and brokered fetches are served on the caller's host, exactly as locally, and
the node never needs a way to reach the caller. Ray only carries dicts between trusted processes; the sandbox
still speaks the JSON-only channel of ``sandbox/exchange.py`` with the node's exchange.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandforge.sandbox import leftovers
from sandforge.sandbox.backends.base import Worker
from sandforge.sandbox.cluster.channel import ChannelServer
from sandforge.sandbox.cluster.wire import NODE_CACHE_BYTES, Wire, WireError, outcome_to_wire, request_from_wire
from sandforge.sandbox.config import BackendName, SandboxConfig
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.environment import MountedEnvironment
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.exchange import CANCELLED_MESSAGE
from sandforge.sandbox.protocol import CallFrame, DeclareFrame, ErrorType, ExecutionOutcome, ExecutionRequest, Limits
from sandforge.sandbox.steps import Blocking, Effect, run_steps

log = logging.getLogger(__name__)

#: How long the node waits past an execution's own limits for the caller to answer or collect (the caller
#: vanished: the execution ends, its sandbox is destroyed, nothing waits forever).
GRACE_S = 30.0
#: The caller/host calling convention: part of the host actor's name, so a caller never drives a host of another
#: version left running on the cluster (2: ``start`` takes one message; direct GCS connections; 3: the direct
#: channel, ``channel``/``serve``).
PROTOCOL = 3
#: Executions one host runs at once (the actor's ``max_concurrency``: each holds one of its threads).
MAX_RUNS = 256
#: Threads that destroy finished sandboxes after their outcome went back to the caller.
CLEANUP_THREADS = 4
#: Ids of executions cancelled before they started here, remembered (a cancel may overtake its ``start``:
#: a threaded actor runs its calls in any order).
CANCELLED_MEMORY = 4096


def cancelled(backend: str = "") -> ExecutionOutcome:
    """What an execution its caller cancelled ends with, on the node and the caller's side alike (nobody reads
    it): as a timeout, like the exchange's own cancellation."""
    return ExecutionOutcome.failure(ErrorType.TIMEOUT, CANCELLED_MESSAGE, backend=backend)


class BlobCache:
    """Large context texts by digest, bounded in bytes (least recently used out)."""

    def __init__(self, limit: int = NODE_CACHE_BYTES) -> None:
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, blobs: dict[str, bytes]) -> None:
        with self._lock:
            for ref, text in blobs.items():
                if ref in self._items:
                    continue
                self._items[ref] = bytes(text)
                self._size += len(text)
            while self._size > self._limit and self._items:
                _, old = self._items.popitem(last=False)
                self._size -= len(old)

    def view(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self._items)

    def __len__(self) -> int:
        return len(self._items)


class _Run:
    """One execution on this node: its thread, the events it parks for the caller, the caller's answers."""

    def __init__(self, request: ExecutionRequest, timeout_s: float) -> None:
        self.request = request
        self.events: queue.Queue[Wire] = queue.Queue()
        self.replies: queue.Queue[Any] = queue.Queue()
        self.deadline = time.monotonic() + timeout_s
        self.lock = threading.Lock()
        self.worker: Worker | None = None  # the sandbox it was given, while its execution runs
        self.cancelled = False

    def given(self, worker: Worker) -> Worker:
        """The worker this run was handed; one handed to a run already cancelled is destroyed instead."""
        with self.lock:
            if not self.cancelled:
                self.worker = worker
                return worker
        worker.destroy()
        raise SandboxUnavailable(CANCELLED_MESSAGE, retriable=False)  # the caller ended it: not to be run again

    def ended(self) -> None:
        with self.lock:
            self.worker = None  # its program is over: nothing to kill (and its process may be reaped)

    def cancel(self) -> None:
        """Its caller is gone: the program is killed (the execution then ends as killed, its worker destroyed
        as after any execution); a frame it waits on is answered with nothing."""
        with self.lock:
            self.cancelled = True
            worker = self.worker
        if worker is not None:
            worker.kill()
        self.replies.put(None)

    def ask(self, event: Wire) -> Any:
        """Park ``event`` for the caller and wait for its answer (None if the caller never answers)."""
        self.events.put(event)
        try:
            return self.replies.get(timeout=max(self.deadline - time.monotonic(), 0.0) + GRACE_S)
        except queue.Empty:
            return None


_NO_ANSWER = {"status": "error", "error_type": "internal_error", "error_message": "the caller did not answer"}


class _Proxy:
    """The bridge handler the node's exchange sees: each frame travels to the caller as an event."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    def __call__(self, frame: CallFrame) -> dict[str, Any]:
        answer = self._run.ask({"kind": "call", "frame": frame.model_dump(mode="json"), **_remaining()})
        return answer if isinstance(answer, dict) else _NO_ANSWER


class _DeclaringProxy(_Proxy):
    def declare(self, frame: DeclareFrame) -> dict[str, Any]:
        answer = self._run.ask({"kind": "declare", "frame": frame.model_dump(mode="json")})
        return answer if isinstance(answer, dict) else _NO_ANSWER


class _FetchingProxy(_Proxy):
    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        answer = self._run.ask({"kind": "fetch", "request": request, "remaining_s": deadline - time.monotonic()})
        if not isinstance(answer, dict):
            return b"", None  # malformed: the exchange answers the program with its typed broker failure
        return bytes(answer["reply"]), None if answer.get("body") is None else bytes(answer["body"])


class _FullProxy(_DeclaringProxy, _FetchingProxy):
    pass


def _remaining() -> dict[str, float]:
    from sandforge.sandbox.exchange import serving_deadline

    deadline = serving_deadline()
    return {} if deadline is None else {"remaining_s": deadline - time.monotonic()}


def _node_address() -> str:
    """The address Ray knows this node by (the one callers reach it at); loopback outside a Ray worker. Ray is
    never imported here: it reads its settings (the local cluster's loopback flag) once, on first import."""
    ray: Any = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # a Ray that cannot tell
        log.debug("no Ray node address", exc_info=True)
    return "127.0.0.1"  # not in a Ray worker (tests drive a host in-process)


def _proxy(run: _Run, kinds: list[str]) -> _Proxy:
    declare, egress = "declare" in kinds, "egress" in kinds
    cls = _FullProxy if declare and egress else _DeclaringProxy if declare else _FetchingProxy if egress else _Proxy
    return cls(run)


class SandboxHost:
    """A node's sandbox host (made a Ray actor by the executor: ``ray.remote(SandboxHost)``)."""

    def __init__(self, config: dict[str, Any], prewarm: list[str]) -> None:
        from sandforge.sandbox import Sandbox  # the node's own local executor (imported here: no import cycle)

        self.config = SandboxConfig.model_validate({**config, "cluster": None})
        self.sandbox = Sandbox(self.config)
        self.cache = BlobCache()
        self.runs: dict[str, _Run] = {}  # the executions that serve frames (``step`` finds them)
        self.live: dict[str, _Run] = {}  # every execution running here (``cancel`` finds them)
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        self.lock = threading.Lock()
        #: the threads executions that serve frames run on (reused: a new thread per execution cost ~0.2 ms)
        self.threads = ThreadPoolExecutor(max_workers=4 * MAX_RUNS, thread_name_prefix="sandforge-run")
        #: where finished sandboxes are destroyed, after the answer (``_after_answer``)
        self.cleanup = ThreadPoolExecutor(max_workers=CLEANUP_THREADS, thread_name_prefix="sandforge-cleanup")
        self.executed = 0
        self.started_at = time.time()
        self.instance = uuid.uuid4().hex[:12]
        self._server: ChannelServer | None = None
        leftovers.reap_in_background()  # what a predecessor on this machine left when its node died
        for backend in prewarm:
            try:
                self.sandbox.pool(backend)  # type: ignore[arg-type]  # starts filling in the background
            except Exception as exc:  # a backend this node cannot run: reported by status, never chosen
                log.warning("cannot pre-warm %s: %s", backend, exc)

    def ping(self) -> str:
        return self.instance

    def channel(self) -> Wire:
        """Where and how a caller reaches this host directly (``channel.py``): its node's address, a port and
        the secret, handed out only through this (authenticated) actor call; empty if it cannot listen (the
        caller then uses Ray's actor calls)."""
        with self.lock:
            if self._server is None:
                try:
                    self._server = ChannelServer(self.serve, _node_address())
                except OSError as exc:
                    log.warning("cannot open the direct channel: %s", exc)
                    return {}
            host, port = self._server.address
            return {"host": host, "port": port, "secret": self._server.secret, "instance": self.instance}

    def serve(self, message: Wire) -> Wire:
        """One message of the direct channel: ``op`` names the method (``start``, ``step``; ``ping``: the
        caller's first check), ``args`` its arguments, answered as the actor call would be."""
        op, args = message.get("op"), message.get("args", [])
        if op == "ping":
            return {"kind": "pong", "instance": self.instance}
        if op == "start" and isinstance(args, list) and len(args) == 1:
            return self.start(args[0])
        if op == "step" and isinstance(args, list) and len(args) == 2 and isinstance(args[0], str):
            return self.step(args[0], args[1])
        outcome = ExecutionOutcome.failure(ErrorType.INVALID_REQUEST, f"malformed channel message: op {op!r}")
        return self._done(outcome, ContextSnapshot())

    def start(self, call: Wire) -> Wire:
        """Begin one execution; returns its first event (a nested frame, ``missing`` or ``done``). ``call``
        holds ``id``, ``message`` (the wire request), ``backend``, ``blobs`` and ``kinds`` (the frames the
        caller serves; None: none): one argument, as each argument of an actor call is serialised apart."""
        try:
            exec_id: str = call["id"]
            message: Wire = call["message"]
            backend: str = call["backend"]
            blobs: dict[str, bytes] = call["blobs"]
            kinds: list[str] | None = call["kinds"]
        except (KeyError, TypeError) as exc:
            outcome = ExecutionOutcome.failure(ErrorType.INVALID_REQUEST, f"malformed cluster call: {exc}")
            return self._done(outcome, ContextSnapshot())
        if blobs:
            self.cache.add(blobs)
        try:
            request = request_from_wire(message, self.cache.view())
        except (WireError, ValueError) as exc:
            outcome = ExecutionOutcome.failure(ErrorType.INVALID_REQUEST, f"malformed cluster request: {exc}")
            return self._done(outcome, ContextSnapshot())
        if isinstance(request, list):
            return {"kind": "missing", "refs": request}
        limits = request.limits
        run = _Run(request, limits.timeout_s + self.config.spawn_timeout_s)
        with self.lock:
            if exec_id in self.cancelled:  # its caller cancelled it before it got here
                del self.cancelled[exec_id]
                return self._done(cancelled(), ContextSnapshot())
            self.live[exec_id] = run
            if kinds is not None:
                self.runs[exec_id] = run
        if kinds is None:  # no frame can come back before the end: run on this call's thread, no hand-off
            try:
                return self._outcome(run, backend, None)
            finally:
                with self.lock:
                    self.live.pop(exec_id, None)
        self.threads.submit(self._execute, run, backend, _proxy(run, kinds))
        return self._next(exec_id, run)

    def cancel(self, exec_id: str) -> None:
        """The caller no longer waits for ``exec_id`` (its task was cancelled): end it now rather than at its
        limit. One that has not started here yet never will."""
        with self.lock:
            run = self.live.pop(exec_id, None)
            self.runs.pop(exec_id, None)  # its caller collects nothing more: a later ``step`` finds none
            if run is None:
                self.cancelled[exec_id] = None
                while len(self.cancelled) > CANCELLED_MEMORY:
                    self.cancelled.popitem(last=False)
        if run is not None:
            run.cancel()

    def step(self, exec_id: str, answer: Any) -> Wire:
        """Hand the caller's answer to the execution's pending frame; returns its next event."""
        with self.lock:
            run = self.runs.get(exec_id)
        if run is None:
            outcome = ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, "no such execution on this node")
            return self._done(outcome, ContextSnapshot())
        run.replies.put(answer)
        return self._next(exec_id, run)

    def _next(self, exec_id: str, run: _Run) -> Wire:
        try:
            event = run.events.get(timeout=max(run.deadline - time.monotonic(), 0.0) + GRACE_S)
        except queue.Empty:
            event = self._done(
                ExecutionOutcome.failure(ErrorType.TIMEOUT, "the execution did not end on its node"), ContextSnapshot()
            )
        if event["kind"] == "done":
            with self.lock:
                self.runs.pop(exec_id, None)
                self.live.pop(exec_id, None)
        return event

    def _execute(self, run: _Run, backend: str, bridge: _Proxy | None) -> None:
        run.events.put(self._outcome(run, backend, bridge))

    def _outcome(self, run: _Run, backend: str, bridge: _Proxy | None) -> Wire:
        """Run the execution here; its ``done`` event."""
        base = ContextSnapshot.coerce(run.request.context)
        destroys: list[Callable[[], None]] = []

        def acquire(name: BackendName, limits: Limits, environment: MountedEnvironment | None) -> Effect:
            take = self.sandbox._acquire
            return Blocking(lambda: run.given(take(name, limits, environment)))  # a run cancelled meanwhile: refused

        try:
            steps = self.sandbox.outline(run.request, backend, bridge, acquire)  # type: ignore[arg-type]
            outcome = run_steps(steps, detach=destroys.append)
        except Exception as exc:  # never leave the caller waiting
            log.exception("execution failed on this node")
            outcome = ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, f"node failure: {exc}")
        finally:
            run.ended()
        with self.lock:
            self.executed += 1
        try:
            return self._done(outcome, base, backend, run.request)
        finally:
            self._after_answer(destroys)

    def _after_answer(self, destroys: list[Callable[[], None]]) -> None:
        """Destroy the execution's worker on a clean-up thread, as late as the host can (its answer is built;
        Ray sends it as the method returns); in place when the host is closing."""
        if not destroys:
            return
        try:
            self.cleanup.submit(self._clean_up, destroys)
        except RuntimeError:  # shut down: nothing outlives the host
            self._clean_up(destroys)

    @staticmethod
    def _clean_up(destroys: list[Callable[[], None]]) -> None:
        for destroy in destroys:
            try:
                destroy()
            except Exception:  # logged: a clean-up thread has nobody to raise to
                log.exception("destroying a finished sandbox failed on this node")

    def _done(
        self, outcome: ExecutionOutcome, base: ContextSnapshot, backend: str | None = None,
        request: ExecutionRequest | None = None,
    ) -> Wire:  # fmt: skip
        event = {"kind": "done", **outcome_to_wire(outcome, base), "instance": self.instance}
        if backend is not None and request is not None:
            env = request.environment.env_id if request.environment is not None else None
            event["warm"] = self._warm(backend, env)
        return event

    def _warm(self, backend: str, env_id: str | None) -> int:
        for pool in self.sandbox.pool_status():
            if pool["backend"] == backend and pool["env_id"] == env_id:
                return int(pool["ready"])
        return 0

    def status(self) -> Wire:
        """This node's pools and load, for placement and ``sandforge cluster status``."""
        with self.lock:
            in_flight, executed = len(self.live), self.executed
        return {
            "instance": self.instance,
            "pid": os.getpid(),
            "node_pid": os.getppid(),
            "pools": self.sandbox.pool_status(),
            "in_flight": in_flight,
            "executed": executed,
            "cached_blobs": len(self.cache),
            "load": list(os.getloadavg()),
            "started_at": self.started_at,
        }

    def refill(self, backend: str, timeout_s: float = 30.0) -> bool:
        """Wait until the backend's warm pool is full (tests and benchmarks)."""
        pool = self.sandbox.pool(backend)  # type: ignore[arg-type]
        return pool.wait_ready(timeout=timeout_s)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cleanup.shutdown(wait=True)  # the sandboxes of finished executions are gone before the pools close
        self.sandbox.close()
        self.threads.shutdown(wait=False)
