"""Execution layer: run a tool program in a disposable sandbox and get an ExecutionOutcome back.

with Sandbox(SandboxConfig(backend="subprocess")) as sb:
    outcome = sb.execute(ExecutionRequest(code="context['n'] = 1\\nreturn 2"))

async with AsyncSandbox(SandboxConfig(backend="subprocess")) as sb:    # the same, awaited (sandbox/aio.py)
    outcome = await sb.execute(ExecutionRequest(code="return 2"))
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sandforge.sandbox.backends.base import Backend, Worker
from sandforge.sandbox.cleanup import CleanupQueue
from sandforge.sandbox.config import BACKENDS, BackendName, SandboxConfig
from sandforge.sandbox.environment import EnvironmentRefused, Interpreter, MountedEnvironment, check_mount
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.exchange import DIED_BEFORE_USE, BridgeHandler
from sandforge.sandbox.pool import WarmPool
from sandforge.sandbox.protections import DEFAULT_REQUIRED, MissingProtections, Protection
from sandforge.sandbox.protocol import (
    BridgeReply,
    EnvironmentMount,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    ResourceUsage,
)
from sandforge.sandbox.steps import Await, Blocking, Effect, Steps, run_steps

if TYPE_CHECKING:  # the async half (asyncio, thread pools) loads with the first AsyncSandbox (issue 39)
    from sandforge.sandbox.aio import Threads
    from sandforge.sandbox.cluster.executor import RayExecutor

log = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "DEFAULT_REQUIRED",
    "AsyncSandbox",
    "BridgeHandler",
    "BridgeReply",
    "EnvironmentMount",
    "ErrorType",
    "ExecutionOutcome",
    "ExecutionRequest",
    "Limits",
    "MissingProtections",
    "Protection",
    "ResourceUsage",
    "Sandbox",
    "SandboxConfig",
    "SandboxUnavailable",
    "make_backend",
]


def make_backend(name: BackendName, config: SandboxConfig) -> Backend:
    if name == "subprocess":
        from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend

        return SubprocessBackend(config)
    if name in ("runc", "runsc"):
        from sandforge.sandbox.backends.oci_backend import OciBackend

        return OciBackend(config, runtime=name)
    from sandforge.sandbox.backends.docker_backend import DockerBackend

    return DockerBackend(config, runtime="runsc" if name == "gvisor" else None)


#: Makes the step that gets a worker for (backend, limits, environment): how each API waits for one.
Acquire = Callable[[BackendName, Limits, "MountedEnvironment | None"], Effect]

#: A pool's key: backend, limits profile and the environment its workers mount (None: none).
PoolKey = tuple[str, Limits, MountedEnvironment | None]


#: A finished worker's destruction (descriptors closed, its work directory removed: a journaled rmdir takes
#: milliseconds on a busy disk), after ``Sandbox.execute`` has returned its outcome; ``close`` drains it.
_AFTER_RUN = CleanupQueue("sandforge-after-run")


class Sandbox:
    """Executes requests on the configured backend, from a warm pool when the limits match its profile.

    Pools are per (backend, limits, environment): a worker started with one environment mounted never runs
    a program prepared for another (or for none). The pools of environments stop refilling and are closed
    once unused for ``config.env_pool_idle_s``, and at most ``config.env_pools_max`` of them are kept."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig.from_env()
        self._backends: dict[str, Backend] = {}
        self._pools: dict[PoolKey, WarmPool] = {}
        self._lock = threading.Lock()
        self._remote: RayExecutor | None = None
        #: per thread: the refills the execution running on it owes its warm pools (``_owe_refill``)
        self._owed = threading.local()

    def _cluster(self) -> RayExecutor:
        """The Ray executor (``config.cluster``): executions run on the cluster's nodes (sandbox/cluster/)."""
        with self._lock:
            if self._remote is None:
                from sandforge.sandbox.cluster.executor import RayExecutor

                self._remote = RayExecutor(self.config)
            return self._remote

    def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome:
        """Run one program in a fresh sandbox. Never raises for anything the program or engine does."""
        try:
            return run_steps(self.outline(request, backend, bridge, self._acquire_step), _AFTER_RUN.submit)
        finally:
            owed, self._owed.refills = getattr(self._owed, "refills", []), []
            for nudge in owed:  # the warm pools' refills this execution deferred (``WarmPool.acquire``)
                nudge()

    def _acquire_step(self, name: BackendName, limits: Limits, environment: MountedEnvironment | None) -> Effect:
        return Blocking(functools.partial(self._acquire, name, limits, environment, self._owe_refill))

    def outline(
        self, request: ExecutionRequest, backend: BackendName | None, bridge: BridgeHandler | None, acquire: Acquire
    ) -> Steps[ExecutionOutcome]:
        """One execution as steps, for both APIs: cluster dispatch, admission, a worker (``acquire``: a blocking
        call here, an await on the loop in ``AsyncSandbox``), the worker's own steps, what the outcome notes."""
        name = backend or self.config.backend
        if self.config.cluster:  # the execution moves to a Ray cluster's node (sandbox/cluster/): its client blocks
            from sandforge.sandbox.cluster.executor import Ticket

            ticket = Ticket()  # cancelling the wait tells the node to end the execution
            remote = functools.partial(self._cluster().execute, request, backend=name, bridge=bridge, ticket=ticket)
            moved: ExecutionOutcome = yield Blocking(remote, interruptible=True, on_cancel=ticket.cancel)
            return moved
        admitted = self._admit(request, backend)
        if isinstance(admitted, ExecutionOutcome):
            return admitted
        name, environment = admitted
        asked = time.monotonic()
        retried: str | None = None
        for attempt in range(2):  # a worker that died starting (under load) is replaced once, unseen by the caller
            try:
                worker: Worker = yield acquire(name, request.limits, environment)
            except SandboxUnavailable as exc:
                if exc.retriable and attempt == 0:
                    retried = str(exc)
                    continue
                outcome = self.unavailable(exc, name)
                break
            acquired = time.monotonic()
            outcome = yield from self.run_steps(worker, request, bridge, environment)
            outcome = self.note_acquired(outcome, worker, asked, acquired)
            if attempt == 0 and outcome.metadata.get(DIED_BEFORE_USE):  # nothing of the program ran
                retried = outcome.error_message
                continue
            break
        if retried is not None:
            outcome.metadata["sandbox_retried"] = retried  # what the first worker died of
        return self._finish(outcome)

    # The parts of ``execute`` the async API (``sandbox/aio.py``) shares: only acquiring a worker and driving
    # its steps differ (on the event loop there).

    def _admit(
        self, request: ExecutionRequest, backend: BackendName | None
    ) -> tuple[BackendName, MountedEnvironment | None] | ExecutionOutcome:
        """The backend to run on and the request's environment, checked (a refused one is the outcome)."""
        name = backend or self.config.backend
        try:
            environment = check_mount(request.environment) if request.environment is not None else None
        except EnvironmentRefused as exc:
            outcome = ExecutionOutcome.failure(ErrorType.INVALID_REQUEST, str(exc), retriable=False, backend=name)
            return self._finish(outcome)
        return name, environment

    @staticmethod
    def unavailable(exc: SandboxUnavailable, name: str) -> ExecutionOutcome:
        """The outcome of an execution no worker could be started for."""
        outcome = ExecutionOutcome.failure(
            ErrorType.SANDBOX_UNAVAILABLE, str(exc), retriable=exc.retriable, backend=name
        )
        if isinstance(exc, MissingProtections):
            outcome.protections = exc.verified
            outcome.metadata["protections_missing"] = list(exc.missing)
        return outcome

    @staticmethod
    def note_acquired(outcome: ExecutionOutcome, worker: Worker, asked: float, acquired: float) -> ExecutionOutcome:
        """How the sandbox was had (telemetry, issue 21): cold when it started after it was asked for."""
        outcome.metadata["sandbox_acquire_s"] = round(acquired - asked, 6)
        outcome.metadata["sandbox_start"] = "cold" if worker.created_at >= asked else "warm"
        return outcome

    def _finish(self, outcome: ExecutionOutcome) -> ExecutionOutcome:
        if waived := self.config.waived_protections:
            outcome.metadata["protections_waived"] = list(waived)  # a weaker wall is never silent
        return outcome

    @staticmethod
    def run_steps(
        worker: Worker, request: ExecutionRequest, bridge: BridgeHandler | None, environment: MountedEnvironment | None
    ) -> Steps[ExecutionOutcome]:
        """The execution, after checking the worker mounts the request's environment (never another's). A
        backend whose worker has ``steps`` (subprocess, runc, runsc: file descriptors) is driven step by step;
        another's ``execute`` is one blocking call (Docker: its engine's client blocks)."""
        serves = getattr(worker, "environment", None)
        if serves != environment:
            worker.destroy()
            return ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, "a sandbox of another environment was handed out; refused",
                backend=worker.backend,
            )  # fmt: skip
        steps = getattr(worker, "steps", None)
        if steps is not None:
            outcome: ExecutionOutcome = yield from steps(request, bridge)
        else:
            outcome = yield Blocking(functools.partial(worker.execute, request, bridge), on_cancel=worker.destroy)
        if environment is not None:
            outcome.metadata["env_id"] = environment.env_id
        return outcome

    def pool(
        self, backend: BackendName | None = None, limits: Limits | None = None,
        environment: MountedEnvironment | EnvironmentMount | None = None,
    ) -> WarmPool:  # fmt: skip
        """The warm pool for a backend, limits profile and environment (created on first use)."""
        name = backend or self.config.backend
        if isinstance(environment, EnvironmentMount):
            environment = check_mount(environment)
        key: PoolKey = (name, limits or self.config.limits, environment)
        with self._lock:
            self._retire_env_pools(keep=key)
            pool = self._pools.get(key)
            if pool is None or pool.retired:
                be = self._backend(name)
                lim, env = key[1], key[2]
                size = self.config.pool_size if lim == self.config.limits else 0
                pool = WarmPool(
                    lambda: be.spawn(lim, env) if env is not None else be.spawn(lim),
                    size=size,
                    idle_s=self.config.pool_idle_s,
                    name=name if env is None else f"{name}-{env.env_id[:8]}",
                    concurrency=self.config.pool_spawn_concurrency,
                    retire_idle_s=self.config.env_pool_idle_s if env is not None else None,
                    prestart_threads=self.config.prestart_threads,
                )
                self._pools[key] = pool
            return pool

    def _retire_env_pools(self, keep: PoolKey) -> None:
        """Drop environment pools that retired themselves (unused too long), and the least recently used ones
        beyond ``env_pools_max``; closed off the caller's path. Holds ``self._lock``."""
        env_keys = [k for k in self._pools if k[2] is not None and k != keep]
        retired = [k for k in env_keys if self._pools[k].retired]
        live = sorted((k for k in env_keys if k not in retired), key=lambda k: self._pools[k].last_used)
        excess = len(live) + (1 if keep[2] is not None else 0) - self.config.env_pools_max
        doomed = [self._pools.pop(k) for k in [*retired, *live[: max(excess, 0)]]]
        for pool in doomed:
            pool.close_in_background()

    def pool_status(self) -> list[dict[str, Any]]:
        """Each live warm pool: backend, environment id (None: none), ready workers (``cluster status``)."""
        with self._lock:
            pools = list(self._pools.items())
        return [
            {"backend": k[0], "env_id": k[2].env_id if k[2] is not None else None, "ready": p.ready_count(),
             "size": p.size, "default_limits": k[1] == self.config.limits}
            for k, p in pools if not p.retired
        ]  # fmt: skip

    def env_pools(self) -> list[str]:
        """The environments that have a live warm pool (for tests and ``doctor``)."""
        with self._lock:
            return sorted({k[2].env_id for k, p in self._pools.items() if k[2] is not None and not p.retired})

    def interpreter(self, backend: BackendName | None = None) -> Interpreter:
        """Which interpreter runs programs on ``backend``: what its environments are built for."""
        name = backend or self.config.backend
        if name == "subprocess":
            return Interpreter(name, python=self.config.python or sys.executable)
        from sandforge.sandbox import image

        runtime = "runsc" if name in ("gvisor", "runsc") else "runc"
        return Interpreter(name, image=image.expected_tag(self.config.image), runtime=runtime)

    def _backend(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            if name not in BACKENDS:
                raise SandboxUnavailable(
                    f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}", retriable=False
                )
            backend = make_backend(name, self.config)
            self._backends[name] = backend
        return backend

    def prestart(self, limits: Limits | None = None) -> None:
        """Begin starting what the first execution under ``limits`` (default: the configured ones) will need,
        without waiting for it, while the caller does its own work: the subprocess backend's zygote (a one-shot
        ``sandforge exec`` overlaps it with its imports and the policy pass). Nothing runs a program before ``execute``;
        ``close`` ends what was started. The container backends and a cluster start nothing ahead: their
        engines are reached only for an approved program, as before."""
        if self.config.cluster or self.config.backend != "subprocess":
            return
        with self._lock:
            backend = self._backend(self.config.backend)
        start = getattr(backend, "prestart", None)
        if start is not None:
            start(limits or self.config.limits)

    def _acquire(
        self, name: BackendName, limits: Limits, environment: MountedEnvironment | None,
        refill: Callable[[Callable[[], None]], None] | None = None,
    ) -> Worker:  # fmt: skip
        if limits == self.config.limits:
            return self.pool(name, limits, environment).acquire(refill)
        return self._spawner(name, limits, environment)()

    def _owe_refill(self, nudge: Callable[[], None]) -> None:
        """Wake a pool's refill when this thread's execution has answered (``execute``)."""
        owed: list[Callable[[], None]] = getattr(self._owed, "refills", [])
        owed.append(nudge)
        self._owed.refills = owed

    def _spawner(
        self, name: BackendName, limits: Limits, environment: MountedEnvironment | None
    ) -> Callable[[], Worker]:
        """Starts a worker outside the pools (limits other than the configured ones)."""
        with self._lock:
            backend = self._backend(name)
        if environment is not None:
            return functools.partial(backend.spawn, limits, environment)
        return functools.partial(backend.spawn, limits)

    def close(self) -> None:
        _AFTER_RUN.drain()
        with self._lock:
            remote, self._remote = self._remote, None
            pools, self._pools = list(self._pools.values()), {}
            backends, self._backends = list(self._backends.values()), {}
        for pool in pools:
            pool.close()
        for backend in backends:
            backend.close()
        if remote is not None:
            remote.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSandbox:
    """:class:`Sandbox` for asyncio. It wraps a :class:`Sandbox` (its backends and warm pools): given one,
    it shares it and leaves closing it to its owner; given a config (or nothing), it makes and closes its own.
    """

    def __init__(self, config: SandboxConfig | Sandbox | None = None, *, threads: Threads | None = None) -> None:
        from sandforge.sandbox.aio import Threads  # asyncio: never loaded by the sync API (``sandforge exec``)

        self.sandbox = config if isinstance(config, Sandbox) else Sandbox(config)
        self._owns = not isinstance(config, Sandbox)
        self.threads = threads or Threads()

    @property
    def config(self) -> SandboxConfig:
        return self.sandbox.config

    async def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome:
        """:meth:`Sandbox.execute`, awaited. Never raises for anything the program or engine does; raises
        ``CancelledError`` when the awaiting task is cancelled (the execution is then ended and cleaned up).
        ``bridge`` is called on a thread of the pool (it is sync code: the agent's nested calls)."""
        from sandforge.sandbox.aio import drive

        outcome: ExecutionOutcome = await drive(self.sandbox.outline(request, backend, bridge, self._acquire_step),
                                                self.threads)  # fmt: skip
        return outcome

    def _acquire_step(self, name: BackendName, limits: Limits, environment: MountedEnvironment | None) -> Await:
        return Await(functools.partial(self._acquire, name, limits, environment))

    async def _acquire(self, name: BackendName, limits: Limits, environment: MountedEnvironment | None) -> Worker:
        sb = self.sandbox
        if limits == sb.config.limits:
            return await sb.pool(name, limits, environment).acquire_async(self.threads.short, self.threads.after_run)
        import asyncio

        from sandforge.sandbox.aio import unless_cancelled

        spawn = sb._spawner(name, limits, environment)
        starting = asyncio.get_running_loop().run_in_executor(self.threads.short, spawn)
        worker: Worker = await unless_cancelled(starting, self.threads.short)
        return worker

    async def aclose(self) -> None:
        """Close what this object opened (its threads, once the clean-ups handed to them ended; the sandbox too,
        unless it was given one)."""
        import asyncio

        loop = asyncio.get_running_loop()
        if self._owns:
            await loop.run_in_executor(None, self.sandbox.close)
        await self.threads.shutdown_async()  # the detached clean-ups, awaited: the loop is never blocked

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
