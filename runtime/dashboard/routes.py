"""The dashboard's routes: each page at ``/dashboard/...`` (cookie session) and its JSON twin at
``/v1/dashboard/...`` (bearer token, through the service's gatekeeper), both from the same builder.

Pages are a view of their twin: a builder returns a pydantic model, the model is dumped to JSON and scrubbed
of host paths, and that one dict is either returned (twin, or a page with ``?format=json``) or rendered.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from sandforge.runtime.dashboard import auth, render
from sandforge.runtime.dashboard.queries import PageError, artifact_query, calls_query, page_query, tools_query
from sandforge.runtime.dashboard.views import (
    Board,
    artifact_page,
    call_page,
    calls_page,
    overview_page,
    patterns_page,
    tools_page,
)
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.errors import InvalidNameError, ToolNotFoundError
from sandforge.sandbox import SandboxConfig

log = logging.getLogger(__name__)

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")  # fmt: skip
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",  # no-referrer would make form posts send `Origin: null`
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
}


class TenantLike(Protocol):
    """What the dashboard reads of a tenant (``runtime.service.tenants.TenantRuntime`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def tool_store(self) -> ToolStore: ...
    @property
    def call_log_path(self) -> Path: ...
    @property
    def policy(self) -> Policy: ...
    def sandbox_config(self) -> SandboxConfig: ...


Builder = Callable[[Board, Request], BaseModel | None]


@dataclass(frozen=True)
class PageSpec:
    path: str
    twin: str
    template: str
    build: Builder
    nav: str


class Dashboard:
    """The dashboard's state in one app: tenants' boards (their caches), sessions, the service's hooks."""

    def __init__(
        self,
        *,
        for_token: Callable[[str | None], TenantLike | None],
        scrub: Callable[[Any], Any],
        audit: Callable[[dict[str, Any]], None],
    ) -> None:
        self.for_token = for_token
        self.scrub = scrub
        self.audit = audit
        self.sessions = auth.Sessions()
        self._boards: dict[str, Board] = {}

    def board(self, rt: TenantLike) -> Board:
        board = self._boards.get(rt.name)
        if board is None or board.store is not rt.tool_store:
            board = Board(tenant=rt.name, store=rt.tool_store, call_log=rt.call_log_path, policy=rt.policy,
                          sandbox=rt.sandbox_config())  # fmt: skip
            self._boards[rt.name] = board
        return board

    def session(self, request: Request) -> tuple[str, TenantLike] | None:
        token = request.cookies.get(auth.COOKIE)
        rt = self.for_token(token) if token else None
        return (token, rt) if token and rt is not None else None

    def record(self, request: Request, tenant: str | None, status: int, outcome: str, started: float) -> None:
        client = request.client
        self.audit({
            "request_id": uuid.uuid4().hex[:16], "tenant": tenant, "method": request.method,
            "path": request.url.path[:512], "status": status, "outcome": outcome,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3), "client": client.host if client else None,
        })  # fmt: skip

    def close(self) -> None:
        for board in self._boards.values():
            board.close()


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**HEADERS, **(headers or {})})


def _error_page(status: int, message: str, tenant: str | None = None) -> HTMLResponse:
    return _html(render.page("error.html", status=status, message=message, tenant=tenant, nav="", csrf=""), status)


def _json_error(status: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": error_type, "message": message}}, status_code=status)


# --- builders ------------------------------------------------------------------------------------------


def _overview(board: Board, request: Request) -> BaseModel:
    return overview_page(board)


def _tools(board: Board, request: Request) -> BaseModel:
    return tools_page(board, **tools_query(request.query_params))


def _artifact(board: Board, request: Request) -> BaseModel | None:
    p = request.path_params
    return artifact_page(board, p["role"], p["method"], **artifact_query(request.query_params))


def _calls(board: Board, request: Request) -> BaseModel:
    return calls_page(board, calls_query(request.query_params))


def _call(board: Board, request: Request) -> BaseModel | None:
    return call_page(board, request.path_params["call_id"])


def _patterns(board: Board, request: Request) -> BaseModel:
    return patterns_page(board, **page_query(request.query_params))


PAGES = (
    PageSpec("/dashboard", "/v1/dashboard/overview", "overview.html", _overview, "overview"),
    PageSpec("/dashboard/tools", "/v1/dashboard/tools", "tools.html", _tools, "tools"),
    PageSpec(
        "/dashboard/tools/{role}/{method}", "/v1/dashboard/tools/{role}/{method}", "artifact.html", _artifact, "tools"
    ),
    PageSpec("/dashboard/calls", "/v1/dashboard/calls", "calls.html", _calls, "calls"),
    PageSpec("/dashboard/calls/{call_id}", "/v1/dashboard/calls/{call_id}", "call.html", _call, "calls"),
    PageSpec("/dashboard/patterns", "/v1/dashboard/patterns", "patterns.html", _patterns, "patterns"),
)


def _safe(build: Builder) -> Builder:
    """A name the store refuses is a page that does not exist."""

    def run(board: Board, request: Request) -> BaseModel | None:
        try:
            return build(board, request)
        except (InvalidNameError, ToolNotFoundError):
            return None

    return run


async def _data(dash: Dashboard, rt: TenantLike, spec: PageSpec, request: Request) -> dict[str, Any] | None:
    board = dash.board(rt)
    model = await anyio.to_thread.run_sync(lambda: _safe(spec.build)(board, request))
    if model is None:
        return None
    data: dict[str, Any] = dash.scrub(model.model_dump(mode="json"))
    return data


def _page_route(dash: Dashboard, spec: PageSpec) -> Callable[[Request], Awaitable[Response]]:
    async def page(request: Request) -> Response:
        session = dash.session(request)
        if session is None:
            return RedirectResponse("/dashboard/login", status_code=303, headers=HEADERS)
        token, rt = session
        try:
            data = await _data(dash, rt, spec, request)
        except PageError as exc:
            return _error_page(422, exc.message, rt.name)
        if data is None:
            return _error_page(404, "no such page for this tenant", rt.name)
        if request.query_params.get("format") == "json":
            return JSONResponse(data, headers=HEADERS)
        twin = spec.twin.format(**request.path_params)
        body = render.page(
            spec.template, d=data, tenant=rt.name, nav=spec.nav, csrf=dash.sessions.csrf(token), twin=twin,
            query=dict(request.query_params), notice=request.query_params.get("notice"),
        )  # fmt: skip
        return _html(body)

    return page


def _twin_route(dash: Dashboard, spec: PageSpec) -> Callable[[Request], Awaitable[Response]]:
    async def twin(request: Request) -> Response:
        rt: TenantLike | None = request.scope.get("state", {}).get("tenant")
        if rt is None:  # unreachable behind the gatekeeper; fail closed anyway
            return _json_error(401, "unauthorized", "a valid bearer token is required")
        try:
            data = await _data(dash, rt, spec, request)
        except PageError as exc:
            return _json_error(422, "invalid_request", exc.message)
        if data is None:
            return _json_error(404, "not_found", "no such resource")
        return JSONResponse(data)

    return twin


def install(app: FastAPI, dash: Dashboard) -> None:
    """Add the pages, their twins, login/logout, rollback and the stylesheet to ``app``."""
    from sandforge.runtime.dashboard import actions

    app.state.dashboard = dash
    for spec in PAGES:
        app.add_route(spec.path, _page_route(dash, spec), methods=["GET"], include_in_schema=False)
        app.add_route(spec.twin, _twin_route(dash, spec), methods=["GET"], include_in_schema=False)
    actions.install(app, dash)
