"""What a client that speaks OAuth hears from a service that only takes bearer tokens (docs/serve.md, "Bearer
tokens, not OAuth").

The service's tokens come from ``sandforge tokens create``; it has no OAuth authorization server. The MCP
authorization specification makes OAuth optional and asks a server that does implement it for RFC 9728
protected-resource metadata naming at least one authorization server, so sandforge publishes none (a document
with no authorization server is not one an MCP client can use) and its 401 carries no ``resource_metadata``.
Its challenge is RFC 6750's: ``Bearer realm="sandforge"`` without a token, plus ``error="invalid_token"``
when the token presented is not valid.

Hosts built on the TypeScript SDK (MCP Inspector's web UI, many IDEs) start OAuth discovery on any 401
whatever the challenge says, and fall back to the legacy endpoints on the server's origin, ending at a dynamic
client registration (``POST /register``). So those paths answer an OAuth error (RFC 6749 section 5.2's shape,
which the SDK shows as is) saying how to authenticate, and the attempt ends there, at no authorization page.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

REALM = "sandforge"
#: what an OAuth client reads when it looks for an authorization server here
NO_OAUTH = (
    "sandforge has no OAuth authorization server: send an API token of `sandforge tokens create TENANT` "
    "as the header `Authorization: Bearer <token>`"
)
#: the paths OAuth clients probe (RFC 9728, RFC 8414, OpenID discovery; the legacy MCP endpoints on the origin)
PROBED = (
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
)
LEGACY_ENDPOINTS = ("/register", "/authorize", "/token")


def challenge(token_presented: bool) -> str:
    """The ``WWW-Authenticate`` value of a 401 (RFC 6750 section 3: no error code when no token was sent)."""
    if not token_presented:
        return f'Bearer realm="{REALM}"'
    return f'Bearer realm="{REALM}", error="invalid_token", error_description="the bearer token is not valid"'


def _no_oauth() -> JSONResponse:
    return JSONResponse({"error": "access_denied", "error_description": NO_OAUTH}, status_code=404,
                        headers={"Cache-Control": "no-store"})  # fmt: skip


def install(app: FastAPI) -> None:
    """The OAuth paths clients probe: each a 404 with an OAuth error saying how to authenticate instead."""

    async def no_oauth() -> JSONResponse:
        return _no_oauth()

    for prefix in PROBED:  # also with the resource's path inserted (RFC 9728 section 3.1, RFC 8414 section 3.1)
        app.add_api_route(prefix, no_oauth, methods=["GET"], include_in_schema=False)
        app.add_api_route(prefix + "/{resource:path}", no_oauth, methods=["GET"], include_in_schema=False)
    for path in LEGACY_ENDPOINTS:
        app.add_api_route(path, no_oauth, methods=["GET", "POST"], include_in_schema=False)
