"""A role's committed context over HTTP (issue 37): ``GET`` and ``PUT /v1/roles/{role}/context``.

The representation is the context itself (a JSON object). Its ``ETag`` is strong: the number of commits of the
role's context and a hash of its content (``runtime.agent.statedb.Committed.etag``). ``PUT`` replaces the
context only when ``If-Match`` names the current tag (or is ``*``): a stale tag is 412 and changes nothing, no
``If-Match`` at all is 428 (RFC 6585: a client that did not read first cannot have meant to overwrite). Both run
in the tenant's state database (``TenantRuntime.state``: no provider or sandbox is built for them), so
``serve`` and ``sandforge mcp`` on one tenant read and write one context.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Body, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import JsonValue

from sandforge.runtime.names import valid_role
from sandforge.runtime.service.audit import note
from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, mark
from sandforge.sandbox.context import ContextError, ContextSnapshot

CONTEXT_ERRORS: dict[int | str, dict[str, object]] = {
    **ERRORS,
    412: {"description": "If-Match names another version than the current one (the ETag header has it)"},
    428: {"description": "PUT without If-Match (read the context first, or send If-Match: *)"},
}


def _role(role: str) -> str:
    if not valid_role(role):
        raise ApiError(404, "not_found", "no such role")
    return role


def install(app: FastAPI, service: Service) -> None:
    @app.get("/v1/roles/{role}/context", responses=CONTEXT_ERRORS, tags=["state"])
    async def get_context(role: str, rt: Tenant, request: Request) -> JSONResponse:
        """The role's committed context (``{}`` before any commit) with its ``ETag``."""
        note(request.scope.get("state"), tool_role=role)
        committed = await service.blocking(lambda: rt.state.read(_role(role)))
        mark(request, "ok")
        # the tenant's own data, as committed: never scrubbed (a GET then PUT must not store a changed value, and
        # the ETag names exactly these bytes); nothing of the host is in it that the tenant did not put there
        return JSONResponse(committed.snapshot.to_dict(), headers={"ETag": committed.etag})

    @app.put("/v1/roles/{role}/context", responses=CONTEXT_ERRORS, tags=["state"])
    async def put_context(
        role: str,
        context: Annotated[dict[str, JsonValue], Body(description="the whole new context (a JSON object)")],
        rt: Tenant,
        request: Request,
        if_match: Annotated[str | None, Header(description="the ETag read last, or *")] = None,
    ) -> JSONResponse:
        """Replace the role's context, if ``If-Match`` names its current version (412 otherwise, 428 without)."""
        note(request.scope.get("state"), tool_role=role)
        if if_match is None:
            raise ApiError(428, "precondition_required", "PUT of a context needs If-Match (its ETag, or *)")
        try:
            snapshot = ContextSnapshot.from_dict(context)
        except ContextError as exc:  # a value JSON cannot carry (NaN)
            raise ApiError(422, "invalid_request", str(exc)) from None
        now, written = await service.blocking(lambda: rt.state.replace(_role(role), snapshot, if_match))
        if not written:
            raise ApiError(412, "precondition_failed", "the context changed since that ETag", {"ETag": now.etag})
        mark(request, "ok")
        return JSONResponse(now.snapshot.to_dict(), headers={"ETag": now.etag})
