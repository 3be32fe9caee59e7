"""Chat sessions over HTTP (RFC-044): ``POST /v1/sessions``, ``GET /v1/sessions``, ``GET /v1/sessions/{id}``,
``POST /v1/sessions/{id}/messages``. Sessions live in the tenant's own database, so another tenant's session
id is not found (404) and never listed. Tool groups are the tenant's ToolStore roles; their calls run through
the tenant's workspace (provider, sandbox, policy, call log). Answers are :mod:`.session_models` (RFC 3339
times)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, mark
from sandforge.runtime.service.models import MessageRequest
from sandforge.runtime.service.session_models import (
    PAGE_DEFAULT,
    PAGE_MAX,
    SessionCreate,
    SessionMessage,
    SessionPage,
    SessionSummary,
    SessionView,
    TurnAnswer,
)
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


def _view(rt: TenantRuntime, session_id: str) -> SessionView:
    store = rt.sessions
    full = store.resolve_id(session_id)
    info = store.get_session(full)
    return SessionView(session=SessionSummary.of(info), messages=[SessionMessage.of(m) for m in store.messages(full)])


def _page(rt: TenantRuntime, limit: int, cursor: str | None) -> SessionPage:
    """Newest first; a cursor is the last id of the page before (an id that is not the tenant's: 422)."""
    infos = rt.sessions.page_sessions(limit=limit + 1, after=cursor)
    more = len(infos) > limit
    infos = infos[:limit]
    return SessionPage(sessions=[SessionSummary.of(i) for i in infos], next_cursor=infos[-1].id if more else None)


def _answer(service: Service, model: BaseModel, status_code: int = 200) -> JSONResponse:
    return JSONResponse(service.scrub(model.model_dump(mode="json")), status_code=status_code)


def _not_found() -> ApiError:
    return ApiError(404, "not_found", "no such session")


def _read_routes(app: FastAPI, service: Service) -> None:
    from sandforge.runtime.sessions import SessionNotFoundError

    @app.get("/v1/sessions", response_model=SessionPage, responses=ERRORS, tags=["sessions"])
    async def list_sessions(
        rt: Tenant,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT,
        cursor: Annotated[str | None, Query(max_length=64)] = None,
    ) -> JSONResponse:
        """The tenant's sessions, newest first, ``limit`` a page; ``next_cursor`` is the next page's ``cursor``."""
        try:
            page = await service.blocking(lambda: _page(rt, limit, cursor))
        except SessionNotFoundError:
            raise ApiError(422, "invalid_request", "cursor: not a session of this tenant") from None
        return _answer(service, page)

    @app.get("/v1/sessions/{session_id}", response_model=SessionView, responses=ERRORS, tags=["sessions"])
    async def get_session(session_id: str, rt: Tenant) -> JSONResponse:
        """A session and its messages (``sandforge sessions show``)."""
        try:
            view = await service.blocking(lambda: _view(rt, session_id))
        except SessionNotFoundError:
            raise _not_found() from None
        return _answer(service, view)


def _write_routes(app: FastAPI, service: Service) -> None:
    from sandforge.runtime.sessions import SessionNotFoundError

    @app.post("/v1/sessions", response_model=SessionSummary, responses=ERRORS, tags=["sessions"], status_code=201)
    async def create_session(rt: Tenant, body: Annotated[SessionCreate | None, Body()] = None) -> JSONResponse:
        """A new, empty chat session of this tenant; the body is optional (``{"title"}``)."""
        title = body.title if body is not None else ""
        info = await service.blocking(lambda: rt.sessions.create_session(title=title))
        return _answer(service, SessionSummary.of(info), 201)

    @app.post("/v1/sessions/{session_id}/messages", response_model=TurnAnswer, responses=ERRORS, tags=["sessions"])
    async def send_message(session_id: str, body: MessageRequest, rt: Tenant, request: Request) -> JSONResponse:
        """One user turn: the model answers, calling the session's tools (through the lifecycle) as it goes."""

        def turn() -> TurnAnswer:
            return TurnAnswer.of(_session(rt, session_id).send(body.text))

        try:
            result = await service.execute(rt, turn)
        except SessionNotFoundError:
            raise _not_found() from None
        except ProviderUnavailable as exc:
            raise ApiError(422, "provider_not_configured", exc.message) from None
        mark(request, "ok")
        return _answer(service, result)


def install(app: FastAPI, service: Service) -> None:
    _write_routes(app, service)
    _read_routes(app, service)
