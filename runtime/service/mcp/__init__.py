"""``sandforge mcp``: sandforge's tools for any MCP client (issue 20), on the official ``mcp`` SDK.

:class:`TenantMCP` is one tenant's server (stdio: ``sandforge mcp``); ``http.py`` serves every tenant of the
service at ``/mcp`` (streamable HTTP, a bearer token per request picks the tenant). The tenant is the
service's :class:`~sandforge.runtime.service.tenants.TenantRuntime` either way.
"""

from sandforge.runtime.service.mcp.server import TenantMCP
from sandforge.runtime.service.mcp.tenant import TenantPort

__all__ = ["TenantMCP", "TenantPort"]
