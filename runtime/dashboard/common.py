"""What the dashboard's pages and actions share: the per-app state, the tenant it reads, response helpers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from sandforge.runtime.dashboard import auth, render
from sandforge.runtime.dashboard.views import Board
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import SandboxConfig

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")  # fmt: skip
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",  # no-referrer would make form posts send `Origin: null`
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
}


class StoredFileLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def media_type(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def sha256(self) -> str: ...


def file_response(record: StoredFileLike, body: bytes | None, headers: dict[str, str]) -> Response:
    """A stored file as a download (``/v1/files/{id}``, a call's output on the dashboard). ``body`` None: a HEAD,
    answered from the file's record (Content-Length, its sha256 as the ETag) without reading the file."""
    headers = {**headers, "etag": f'"{record.sha256}"'}
    if body is None:
        return Response(b"", media_type=record.media_type, headers={**headers, "content-length": str(record.size)})
    return Response(body, media_type=record.media_type, headers=headers)


class StoredFilesLike(Protocol):
    """A tenant's stored files (``runtime.service.uploads.UploadStore``): where a call's kept outputs are."""

    def find(self, sha256: str, name: str) -> StoredFileLike | None: ...
    def read(self, file_id: str) -> tuple[StoredFileLike, bytes] | None: ...


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
    @property
    def uploads(self) -> StoredFilesLike: ...


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
            board = Board(tenant=rt.name, store=rt.tool_store, call_log=rt.call_log_path,
                          policy=lambda: rt.policy, sandbox=rt.sandbox_config)  # fmt: skip
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


def html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**HEADERS, **(headers or {})})


def error_page(status: int, message: str, tenant: str | None = None) -> HTMLResponse:
    return html(render.page("error.html", status=status, message=message, tenant=tenant, nav="", csrf=""), status)


def json_error(status: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": error_type, "message": message}}, status_code=status)


# --- builders ------------------------------------------------------------------------------------------
