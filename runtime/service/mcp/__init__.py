"""``sandforge mcp``: sandforge's tools for any MCP client (issue 20), on the official ``mcp`` SDK.

:class:`TenantMCP` is one tenant's server (stdio: ``sandforge mcp``); ``http.py`` serves every tenant of the
service at ``/mcp`` (streamable HTTP, a bearer token per request picks the tenant). The tenant is the
service's :class:`~sandforge.runtime.service.tenants.TenantRuntime` either way.

Both names load on first use: ``serve`` imports ``http.py``, which imports the SDK only when the first ``/mcp``
request comes (the SDK's import is ~0.7 CPU-s of every ``serve`` start that may never see one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandforge.runtime.service.mcp.server import TenantMCP
    from sandforge.runtime.service.mcp.tenant import TenantPort

__all__ = ["TenantMCP", "TenantPort"]


def __getattr__(name: str) -> Any:
    if name == "TenantMCP":
        from sandforge.runtime.service.mcp.server import TenantMCP

        return TenantMCP
    if name == "TenantPort":
        from sandforge.runtime.service.mcp.tenant import TenantPort

        return TenantPort
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
