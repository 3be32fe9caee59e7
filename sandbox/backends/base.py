"""The one interface every execution backend implements (httpx-style: transports behind one API)."""

from __future__ import annotations

from typing import Protocol

from sandforge.sandbox.environment import MountedEnvironment
from sandforge.sandbox.exchange import BridgeHandler
from sandforge.sandbox.protocol import ExecutionOutcome, ExecutionRequest, Limits


class Worker(Protocol):
    """One disposable sandbox, locked down and ready; it runs exactly one execution, then is destroyed."""

    backend: str
    limits: Limits
    protections: dict[str, bool]
    created_at: float

    def alive(self) -> bool: ...

    def execute(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        """Run the request and destroy the worker, whatever happens."""
        ...

    def kill(self) -> None:
        """End the sandboxed program now, from another thread than the one running its execution (which then
        ends as killed and destroys the worker as usual); nothing is released here. No-op once it ended."""
        ...

    def destroy(self) -> None: ...


class Backend(Protocol):
    name: str

    def spawn(self, limits: Limits, environment: MountedEnvironment | None = None) -> Worker:
        """Start a fresh worker (with ``environment`` mounted read-only, if given); raises SandboxUnavailable
        when that is impossible."""
        ...

    def close(self) -> None: ...
