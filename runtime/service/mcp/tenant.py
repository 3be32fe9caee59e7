"""What the MCP tools need of one tenant (:class:`TenantPort`).

There is one tenant object, :class:`~sandforge.runtime.service.tenants.TenantRuntime`: the HTTP server gets
one per authenticated request from the service's tenant model, the stdio server one from ``--config
--tenant`` or from flags (:func:`~sandforge.runtime.service.tenants.standalone_tenant`). Everything a
tenant's tools touch (the ToolStore, the call log, environments, the sandbox) hangs off it, so two tenants
share nothing but the process. The protocol only says which of its parts the tools use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # types only: the MCP server imports this before its handshake, the agent and store after it
    from sandforge.runtime.agent.statedb import StateDB
    from sandforge.runtime.agent.workspace import Workspace
    from sandforge.runtime.guardrails import Policy
    from sandforge.runtime.service.uploads import UploadStore
    from sandforge.runtime.store import ToolStore
    from sandforge.sandbox import Limits
    from sandforge.sandbox.config import BackendName


class TenantPort(Protocol):
    """The parts of a tenant the MCP tools use (``TenantRuntime`` has them all)."""

    @property
    def name(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def backend(self) -> BackendName: ...

    @property
    def store(self) -> ToolStore: ...

    @property
    def workspace(self) -> Workspace: ...

    @property
    def state(self) -> StateDB:
        """The committed contexts (``sandforge://roles/{role}/context``)."""
        ...

    @property
    def uploads(self) -> UploadStore:
        """The tenant's stored files (``sandforge://files/{id}``; uploaded with ``POST /v1/files``)."""
        ...

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
