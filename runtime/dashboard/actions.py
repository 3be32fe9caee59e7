"""What the dashboard changes, and its session: login, logout, rollback (with CSRF and a confirmation).

Every request here gets an audit line (the pages only read; the gatekeeper already audits the twins and the
API's rollback under /v1). A rollback from the browser needs the session cookie, a same-site request, the
session's CSRF token and ``confirm=yes`` (the confirmation page sets it); it acts on the cookie's tenant's
store only, so another tenant's tool is simply not found.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio.to_thread
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from sandforge.runtime.dashboard import auth, render
from sandforge.runtime.dashboard.common import HEADERS, error_page, html, json_error
from sandforge.runtime.dashboard.views import artifact_page
from sandforge.runtime.store.errors import InvalidNameError, RollbackError, ToolNotFoundError

if TYPE_CHECKING:
    from sandforge.runtime.dashboard.common import Dashboard, TenantLike


ICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
        b'fill="#1d232b"/><path d="M4 11h8l-2-6H6z" fill="#f0a848"/></svg>')


def _redirect(url: str, cookie: str | None = None) -> RedirectResponse:
    headers = dict(HEADERS)
    if cookie is not None:
        headers["set-cookie"] = cookie
    return RedirectResponse(url, status_code=303, headers=headers)


def _login_page(message: str | None = None, status: int = 200) -> Response:
    return html(render.page("login.html", message=message, tenant=None, nav="", csrf=""), status)


def _rollback(rt: TenantLike, role: str, method: str, to: int | None) -> tuple[int, int]:
    """(from, to): the generations before and after; raises the store's typed errors."""
    store = rt.tool_store
    before = store.lookup(role, method).artifact
    restored = store.rollback(role, method, to=to)
    return (before.generation if before else 0), restored.generation


def _parse_to(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise ValueError("to: a generation number")
    return int(value)


def _login_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/dashboard/login", include_in_schema=False)
    async def login_form(request: Request) -> Response:
        code = request.query_params.get("code")
        if code is None:
            return _login_page()
        started = time.perf_counter()
        head = bool(request.scope.get(auth.HEAD_REQUEST))  # a link checker's HEAD: the code stays usable
        token = dash.sessions.redeem(code, consume=not head)
        rt = dash.for_token(token) if token else None
        if token is None or rt is None:
            dash.record(request, None, 401, "unauthorized", started)
            return _login_page("this login link is used up or expired", 401)
        if head:  # the GET's status, but no session cookie: only the GET that uses up the code logs in
            return _redirect("/dashboard")
        dash.record(request, rt.name, 303, "login", started)
        return _redirect("/dashboard", auth.cookie_header(token))

    @app.post("/dashboard/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        started = time.perf_counter()
        fields = await auth.form(request)
        if auth.cross_site(request) or fields is None:
            dash.record(request, None, 403, "forbidden", started)
            return _login_page("refused: not a login form of this site", 403)
        token = fields.get("token", "").strip()
        rt = dash.for_token(token) if token else None
        if rt is None:
            dash.record(request, None, 401, "unauthorized", started)
            return _login_page("that token is not valid", 401)
        dash.record(request, rt.name, 303, "login", started)
        return _redirect("/dashboard", auth.cookie_header(token))



def _logout_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.post("/dashboard/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        started = time.perf_counter()
        session = dash.session(request)
        fields = await auth.form(request) or {}
        if session is None or auth.cross_site(request) or not dash.sessions.csrf_ok(session[0], fields.get("csrf")):
            dash.record(request, session[1].name if session else None, 403, "forbidden", started)
            return error_page(403, "refused: missing or wrong CSRF token")
        dash.record(request, session[1].name, 303, "logout", started)
        return _redirect("/dashboard/login", auth.clear_cookie_header())



def _static_routes(app: FastAPI) -> None:
    @app.get("/dashboard/static/dashboard.css", include_in_schema=False)
    async def stylesheet() -> Response:
        return Response(render.stylesheet(), media_type="text/css", headers={"cache-control": "max-age=3600"})

    @app.get("/dashboard/static/icon.svg", include_in_schema=False)
    async def icon() -> Response:
        return Response(ICON, media_type="image/svg+xml", headers={"cache-control": "max-age=86400"})


ROLLBACK = "/dashboard/tools/{role}/{method}/rollback"
Handler = Callable[[Request], Awaitable[Response]]


def _confirm_handler(dash: Dashboard) -> Handler:
    """The confirmation page: what the rollback would change, and the form (with the session's CSRF token)."""

    async def confirm(request: Request) -> Response:
        role, method = request.path_params["role"], request.path_params["method"]
        session = dash.session(request)
        if session is None:
            return _redirect("/dashboard/login")
        token, rt = session
        try:
            to = _parse_to(request.query_params.get("to"))
            board = dash.board(rt)
            data = await anyio.to_thread.run_sync(lambda: artifact_page(board, role, method, a=None, b=to))
        except (ValueError, InvalidNameError, ToolNotFoundError):
            data = None
        if data is None or to not in data.rollback_targets:
            return error_page(404, "no such generation to roll back to", rt.name)
        d = dash.scrub(data.model_dump(mode="json"))
        body = render.page("rollback.html", d=d, to=to, tenant=rt.name, nav="tools", csrf=dash.sessions.csrf(token),
                           twin=f"/v1/dashboard/tools/{role}/{method}")  # fmt: skip
        return html(body)

    return confirm


async def _checked_form(dash: Dashboard, request: Request, token: str) -> dict[str, str] | None:
    """The form of a same-site request carrying this session's CSRF token, else None."""
    fields = await auth.form(request) or {}
    if auth.cross_site(request) or not dash.sessions.csrf_ok(token, fields.get("csrf")):
        return None
    return fields


def _rollback_handler(dash: Dashboard) -> Handler:
    async def rollback(request: Request) -> Response:
        role, method = request.path_params["role"], request.path_params["method"]
        started = time.perf_counter()
        session = dash.session(request)
        if session is None:
            dash.record(request, None, 401, "unauthorized", started)
            return error_page(401, "log in first")
        token, rt = session
        fields = await _checked_form(dash, request, token)
        if fields is None:
            dash.record(request, rt.name, 403, "csrf_refused", started)
            return error_page(403, "refused: missing or wrong CSRF token", rt.name)
        if fields.get("confirm") != "yes":
            dash.record(request, rt.name, 400, "not_confirmed", started)
            return error_page(400, "a rollback needs its confirmation", rt.name)
        try:
            to = _parse_to(fields.get("to"))
            before, after = await anyio.to_thread.run_sync(lambda: _rollback(rt, role, method, to))
        except (ValueError, RollbackError) as exc:
            dash.record(request, rt.name, 409, "rollback_refused", started)
            return error_page(409, str(exc), rt.name)
        except (InvalidNameError, ToolNotFoundError):
            dash.record(request, rt.name, 404, "not_found", started)
            return error_page(404, "no such tool method for this tenant", rt.name)
        dash.record(request, rt.name, 303, f"rolled_back {role}.{method} {before}->{after}", started)
        notice = quote(f"rolled back from generation {before} to {after}")
        return _redirect(f"/dashboard/tools/{quote(role)}/{quote(method)}?notice={notice}")

    return rollback


class RollbackRequest(BaseModel):
    """The rollback API's body: ``{"to": N}``, or none at all (the generation before the current one)."""

    model_config = ConfigDict(extra="forbid")

    to: int | None = Field(None, ge=0, description="the generation to roll back to")


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(["body", *(str(p) for p in err.get("loc", ()))])
    return f"{where}: {err.get('msg', 'invalid')}"


def _rollback_api_handler(dash: Dashboard) -> Handler:
    """The rollback's JSON twin: bearer token (no cookie, so no CSRF), body ``{"to": N}`` or empty; the
    gatekeeper authenticates and audits it like every /v1 request."""

    async def rollback_api(request: Request) -> Response:
        role, method = request.path_params["role"], request.path_params["method"]
        rt: TenantLike | None = request.scope.get("state", {}).get("tenant")
        if rt is None:
            return json_error(401, "unauthorized", "a valid bearer token is required")
        state = request.scope.setdefault("state", {})
        raw = await request.body()
        try:
            to = (RollbackRequest.model_validate_json(raw) if raw.strip() else RollbackRequest()).to
        except ValidationError as exc:  # the API's one answer to a bad body (docs/serve.md, "Errors")
            state["outcome"] = "invalid_request"
            return json_error(422, "invalid_request", _first_problem(exc))
        try:
            before, after = await anyio.to_thread.run_sync(lambda: _rollback(rt, role, method, to))
        except (ValueError, RollbackError) as exc:
            state["outcome"] = "rollback_refused"
            return json_error(409, "rollback_refused", str(exc).splitlines()[0])
        except (InvalidNameError, ToolNotFoundError):
            state["outcome"] = "not_found"
            return json_error(404, "not_found", "no such tool method")
        state["outcome"] = f"rolled_back {before}->{after}"
        # the audit record's tool fields (what runtime.service.audit.note sets; the names are valid store names here)
        state.setdefault("audit", {}).update(tool_role=role, tool_method=method)
        return JSONResponse({"role": role, "method": method, "previous_generation": before, "generation": after})

    return rollback_api


def _rollback_routes(app: FastAPI, dash: Dashboard) -> None:
    app.add_route(ROLLBACK, _confirm_handler(dash), methods=["GET"], include_in_schema=False)
    app.add_route(ROLLBACK, _rollback_handler(dash), methods=["POST"], include_in_schema=False)
    app.add_route("/v1/dashboard/tools/{role}/{method}/rollback", _rollback_api_handler(dash), methods=["POST"],
                  include_in_schema=False)  # fmt: skip


def install(app: FastAPI, dash: Dashboard) -> None:
    _login_routes(app, dash)
    _logout_routes(app, dash)
    _static_routes(app)
    _rollback_routes(app, dash)
