"""sandforge as a service (issue 20): tenants, tokens, quotas, the audit log, the HTTP API (`sandforge serve`).

Tenants are the security boundary: each has its own state directory (ToolStore, sessions, call log), policy
layer, provider and quotas; :class:`~sandforge.runtime.service.tenants.TenantRuntimes` builds one tenant's
runtime, and both the HTTP API and the MCP server use it. See docs/serve.md.
"""

from __future__ import annotations
