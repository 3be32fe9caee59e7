"""The dashboard's routes: each page at ``/dashboard/...`` (cookie session) and its JSON twin at
``/v1/dashboard/...`` (bearer token, through the service's gatekeeper), both from the same builder.

Pages are a view of their twin: a builder returns a pydantic model, the model is dumped to JSON and scrubbed
of host paths, and that one dict is either returned (twin, or a page with ``?format=json``) or rendered.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from sandforge.runtime.dashboard import auth, render
from sandforge.runtime.dashboard.common import (
    HEADERS,
    Dashboard,
    StoredFileLike,
    TenantLike,
    error_page,
    file_response,
    html,
    json_error,
)
from sandforge.runtime.dashboard.queries import (
    PageError,
    artifact_query,
    calls_query,
    page_query,
    security_query,
    tools_query,
)
from sandforge.runtime.dashboard.views import (
    Board,
    artifact_page,
    call_page,
    calls_page,
    overview_page,
    patterns_page,
    security_page,
    tools_page,
)
from sandforge.runtime.files.media import IMAGE_TYPES, shown_as_image
from sandforge.runtime.store.errors import InvalidNameError, ToolNotFoundError

log = logging.getLogger(__name__)

Builder = Callable[[Board, Request], BaseModel | None]


@dataclass(frozen=True)
class PageSpec:
    path: str
    twin: str
    template: str
    build: Builder
    nav: str


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


def _security(board: Board, request: Request) -> BaseModel:
    return security_page(board, security_query(request.query_params))


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
    PageSpec("/dashboard/security", "/v1/dashboard/security", "security.html", _security, "security"),
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
    with board.calls.reading():  # a background index build steps aside meanwhile
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
            return error_page(422, exc.message, rt.name)
        if data is None:
            return error_page(404, "no such page for this tenant", rt.name)
        if request.query_params.get("format") == "json":
            return JSONResponse(data, headers=HEADERS)
        twin = spec.twin.format(**request.path_params)
        body = render.page(
            spec.template, d=data, tenant=rt.name, nav=spec.nav, csrf=dash.sessions.csrf(token), twin=twin,
            query=dict(request.query_params), notice=request.query_params.get("notice"),
        )  # fmt: skip
        return html(body)

    return page


def _twin_route(dash: Dashboard, spec: PageSpec) -> Callable[[Request], Awaitable[Response]]:
    async def twin(request: Request) -> Response:
        rt: TenantLike | None = request.scope.get("state", {}).get("tenant")
        if rt is None:  # unreachable behind the gatekeeper; fail closed anyway
            return json_error(401, "unauthorized", "a valid bearer token is required")
        try:
            data = await _data(dash, rt, spec, request)
        except PageError as exc:
            return json_error(422, "invalid_request", exc.message)
        if data is None:
            return json_error(404, "not_found", "no such resource")
        return JSONResponse(data)

    return twin


#: What an output file is served with: never run as a page of the dashboard's origin (an SVG's scripts, an
#: HTML file), never sniffed into one; the call page shows images with ``<img>`` only.
OUTPUT_HEADERS = {**HEADERS, "content-security-policy": "default-src 'none'; sandbox"}


def _output_file(
    board: Board, rt: TenantLike, call_id: str, name: str, *, head: bool
) -> tuple[StoredFileLike, bytes | None] | None:
    """A call's output file, as its run kept it (the tenant's stored files, by the name and sha256 the call
    record gives): its record and bytes (None for a HEAD: never read); None when the call, the name or the
    kept file is not there."""
    row = board.calls.find(call_id)
    rec = board.calls.record(row) if row is not None else None
    entry = next((f for f in (rec.output_files or []) if f.name == name), None) if rec is not None else None
    stored = rt.uploads.find(entry.sha256, entry.name) if entry is not None else None
    if stored is None or (head and stored.media_type not in IMAGE_TYPES):  # an image's disposition needs its bytes
        return None if stored is None else (stored, None)
    return rt.uploads.read(stored.id)


def _output_route(dash: Dashboard) -> Callable[[Request], Awaitable[Response]]:
    async def output(request: Request) -> Response:
        session = dash.session(request)
        if session is None:
            return RedirectResponse("/dashboard/login", status_code=303, headers=HEADERS)
        _token, rt = session
        board = dash.board(rt)
        call_id, name = request.path_params["call_id"], request.path_params["name"]
        with board.calls.reading():
            head = auth.is_head(request)
            found = await anyio.to_thread.run_sync(lambda: _output_file(board, rt, call_id, name, head=head))
        if found is None:
            return error_page(404, "no such output file for this tenant (outputs are kept for runs of POST "
                              "/v1/exec, until they age out)", rt.name)  # fmt: skip
        record, body = found
        shown = body is not None and shown_as_image(record.media_type, body)  # the bytes, not the name
        disposition = "inline" if shown else "attachment"
        headers = {**OUTPUT_HEADERS, "content-disposition": f'{disposition}; filename="{name}"'}
        return file_response(record, body, headers)

    return output


def install(app: FastAPI, dash: Dashboard) -> None:
    """Add the pages and their twins to ``app``."""
    for spec in PAGES:
        app.add_route(spec.path, _page_route(dash, spec), methods=["GET"], include_in_schema=False)
        app.add_route(spec.twin, _twin_route(dash, spec), methods=["GET"], include_in_schema=False)
    app.add_route("/dashboard/calls/{call_id}/files/{name}", _output_route(dash), methods=["GET"],
                  include_in_schema=False)  # fmt: skip
