"""Chat sessions over HTTP (RFC-044): ``POST /v1/sessions``, ``GET /v1/sessions/{id}``,
``POST /v1/sessions/{id}/messages``. Sessions live in the tenant's own database, so another tenant's session
id is not found (404). Tool groups are the tenant's ToolStore roles; their calls run through the tenant's
workspace (provider, sandbox, policy, call log)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, mark
from sandforge.runtime.service.models import MessageRequest
from sandforge.runtime.service.tenants import ProviderUnavailable, TenantRuntime

if TYPE_CHECKING:
    from sandforge.runtime.sessions import Session


def _session(rt: TenantRuntime, session_id: str | None) -> Session:
    from sandforge.runtime.sessions import AgentToolRunner, Session, ToolRegistry, ToolStoreGroupSource

    known = None if session_id is None else rt.sessions.resolve_id(session_id)  # 404 before anything else
    runner = AgentToolRunner(workspace=rt.workspace)
    options: dict[str, Any] = {
        "provider": rt.chat_provider,
        "registry": ToolRegistry(ToolStoreGroupSource(rt.tool_store)),
        "runner": runner,
    }
    if known is None:
        return Session.create(rt.sessions, **options)
    return Session.open(rt.sessions, known, **options)


def _view(rt: TenantRuntime, session_id: str) -> dict[str, Any]:
    store = rt.sessions
    full = store.resolve_id(session_id)
    info = store.get_session(full)
    return {
        "session": info.model_dump(mode="json"),
        "messages": [m.model_dump(mode="json") for m in store.messages(full)],
    }


def install(app: FastAPI, service: Service) -> None:
    from sandforge.runtime.sessions import SessionNotFoundError

    def not_found(exc: Exception) -> ApiError:
        return ApiError(404, "not_found", "no such session")

    @app.post("/v1/sessions", responses=ERRORS, tags=["sessions"], status_code=201)
    async def create_session(rt: Tenant) -> JSONResponse:
        """A new, empty chat session of this tenant."""
        info = await service.blocking(lambda: rt.sessions.create_session())
        return JSONResponse(service.scrub(info.model_dump(mode="json")), status_code=201)

    @app.get("/v1/sessions/{session_id}", responses=ERRORS, tags=["sessions"])
    async def get_session(session_id: str, rt: Tenant) -> JSONResponse:
        """A session and its messages (``sandforge sessions show``)."""
        try:
            view = await service.blocking(lambda: _view(rt, session_id))
        except SessionNotFoundError as exc:
            raise not_found(exc) from None
        return JSONResponse(service.scrub(view))

    @app.post("/v1/sessions/{session_id}/messages", responses=ERRORS, tags=["sessions"])
    async def send_message(session_id: str, body: MessageRequest, rt: Tenant, request: Request) -> JSONResponse:
        """One user turn: the model answers, calling the session's tools (through the lifecycle) as it goes."""

        def turn() -> dict[str, Any]:
            session = _session(rt, session_id)
            return session.send(body.text).model_dump(mode="json")

        try:
            result = await service.execute(rt, turn)
        except SessionNotFoundError as exc:
            raise not_found(exc) from None
        except ProviderUnavailable as exc:
            raise ApiError(422, "provider_not_configured", exc.message) from None
        mark(request, "ok")
        return JSONResponse(service.scrub(result))
