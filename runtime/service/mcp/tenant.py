"""What the MCP server needs of one tenant: its state directory, policy, provider, backend and limits.

The stdio server builds one from flags or the environment; the HTTP server gets one per authenticated
request from the service's tenant model. Everything a tenant's tools touch (the ToolStore, the call log,
the sandbox) hangs off one :class:`TenantRuntime`, so two tenants share nothing but the process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, Provider, ProviderError
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Limits
from sandforge.sandbox.config import BackendName

#: The capability tag whose grant lets programs reach the network through the egress broker.
EGRESS_CAPABILITY = "http_fetch"


class NoProvider:
    """The provider of a tenant with none configured: stored tools still run, nothing new is generated."""

    name = "none"

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        raise ProviderError(
            f"no model provider is configured for this tenant, so {request.role}.{request.method} cannot be "
            "generated (only healthy stored tools run)",
            retriable=False,
            kind="no_provider",
        )


@dataclass(frozen=True)
class McpTenant:
    """One tenant as the MCP server sees it (the same things the service's tenant holds)."""

    name: str
    state_dir: Path
    policy: Policy
    provider: Provider | None = None
    backend: BackendName | None = None
    #: Limits of every execution; a request may ask for less, never more (None: the sandbox's defaults).
    limits: Limits | None = None

    @property
    def egress_granted(self) -> bool:
        """Programs of this tenant may reach the network (the tools are then open-world)."""
        return egress_granted(self.policy)


def egress_granted(policy: Policy) -> bool:
    return EGRESS_CAPABILITY in policy.granted


class TenantPort(Protocol):
    """What the MCP tools use of a tenant: the stdio server's :class:`TenantRuntime`, or the service's
    tenant runtime behind ``http.ServiceTenant``."""

    @property
    def name(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def backend(self) -> BackendName | None: ...

    @property
    def store(self) -> ToolStore: ...

    @property
    def workspace(self) -> Workspace: ...

    @property
    def default_limits(self) -> Limits:
        """The limits of a request that asks for none."""
        ...

    @property
    def limit_caps(self) -> tuple[float, int]:
        """The largest timeout (seconds) and memory (MB) a request may ask for."""
        ...

    @property
    def egress_granted(self) -> bool: ...


@dataclass
class TenantRuntime:
    """A tenant's ToolStore and Workspace (the stdio server's :class:`TenantPort`), made on first use and
    closed with :meth:`close`."""

    tenant: McpTenant
    _workspace: Workspace | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def name(self) -> str:
        return self.tenant.name

    @property
    def policy(self) -> Policy:
        return self.tenant.policy

    @property
    def backend(self) -> BackendName | None:
        return self.tenant.backend

    @property
    def egress_granted(self) -> bool:
        return self.tenant.egress_granted

    @property
    def store(self) -> ToolStore:
        """A fresh view of the store on every use: other processes (and calls) may have changed it."""
        return ToolStore(self.tenant.state_dir)

    @property
    def workspace(self) -> Workspace:
        with self._lock:
            if self._workspace is None:
                t = self.tenant
                self._workspace = Workspace(
                    provider=t.provider or NoProvider(),
                    sandbox=t.backend,
                    policy=t.policy,
                    log=t.state_dir / "logs" / "calls.jsonl",
                    store=ToolStore(t.state_dir),
                    limits=t.limits,
                )
            return self._workspace

    @property
    def default_limits(self) -> Limits:
        return self.tenant.limits or self.workspace.limits

    @property
    def limit_caps(self) -> tuple[float, int]:
        """The stdio tenant's limits are both the default and the largest (--timeout, --memory)."""
        limits = self.default_limits
        return limits.timeout_s, limits.memory_mb

    def close(self) -> None:
        with self._lock:
            if self._workspace is not None:
                self._workspace.close()
                self._workspace = None
