"""Execution layer: run a tool program in a disposable sandbox and get an ExecutionOutcome back.

with Sandbox(SandboxConfig(backend="subprocess")) as sb:
    outcome = sb.execute(ExecutionRequest(code="context['n'] = 1\\nreturn 2"))
"""

from __future__ import annotations

import logging
import threading

from sandforge.sandbox.backends.base import Backend, Worker
from sandforge.sandbox.config import BACKENDS, BackendName, SandboxConfig
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.exchange import BridgeHandler
from sandforge.sandbox.pool import WarmPool
from sandforge.sandbox.protections import DEFAULT_REQUIRED, MissingProtections, Protection
from sandforge.sandbox.protocol import BridgeReply, ErrorType, ExecutionOutcome, ExecutionRequest, Limits, ResourceUsage

log = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "DEFAULT_REQUIRED",
    "BridgeHandler",
    "BridgeReply",
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


class Sandbox:
    """Executes requests on the configured backend, from a warm pool when the limits match its profile."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig.from_env()
        self._backends: dict[str, Backend] = {}
        self._pools: dict[tuple[str, Limits], WarmPool] = {}
        self._lock = threading.Lock()

    def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome:
        """Run one program in a fresh sandbox. Never raises for anything the program or engine does."""
        name = backend or self.config.backend
        try:
            worker = self._acquire(name, request.limits)
        except SandboxUnavailable as exc:
            outcome = ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, str(exc), retriable=exc.retriable, backend=name
            )
            if isinstance(exc, MissingProtections):
                outcome.protections = exc.verified
                outcome.metadata["protections_missing"] = list(exc.missing)
        else:
            outcome = worker.execute(request, bridge)
        if waived := self.config.waived_protections:
            outcome.metadata["protections_waived"] = list(waived)  # a weaker wall is never silent
        return outcome

    def pool(self, backend: BackendName | None = None, limits: Limits | None = None) -> WarmPool:
        """The warm pool for a backend and limits profile (created on first use)."""
        name = backend or self.config.backend
        key = (name, limits or self.config.limits)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                be = self._backend(name)
                lim = key[1]
                size = self.config.pool_size if lim == self.config.limits else 0
                pool = WarmPool(
                    lambda: be.spawn(lim),
                    size=size,
                    idle_s=self.config.pool_idle_s,
                    name=name,
                    concurrency=self.config.pool_spawn_concurrency,
                )
                self._pools[key] = pool
            return pool

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

    def _acquire(self, name: BackendName, limits: Limits) -> Worker:
        if limits == self.config.limits:
            return self.pool(name, limits).acquire()
        with self._lock:
            backend = self._backend(name)
        return backend.spawn(limits)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
            backends, self._backends = list(self._backends.values()), {}
        for pool in pools:
            pool.close()
        for backend in backends:
            backend.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
