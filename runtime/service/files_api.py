"""A tenant's stored files over HTTP (issue 41): ``POST /v1/files`` (multipart, or a raw body with ``?name=``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``DELETE /v1/files/{id}``. The store is the tenant's own
(:mod:`.uploads`): another tenant's id is not found, as a made-up one is. ``POST /v1/exec`` takes stored
files by reference (``file_refs``) and keeps an ok run's outputs here.

A download is always an attachment with ``nosniff`` and a CSP that forbids everything (``sandbox``): an SVG or
HTML file a program wrote never runs as a page of this origin, whatever its media type says.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, BinaryIO

import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from sandforge.runtime.dashboard.auth import is_head
from sandforge.runtime.dashboard.common import file_response
from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, mark
from sandforge.runtime.service.gate import BodyTooLarge, ClientGone, Receive, Scope, Send, body_chunks
from sandforge.runtime.service.receiving import Bounds, Received, receive_body
from sandforge.runtime.service.spool import TooLarge, TooMany
from sandforge.runtime.service.tenants import TenantRuntime
from sandforge.runtime.service.uploads import StoredFile, StoreFull, UploadStore

log = logging.getLogger(__name__)
#: what every download carries: never rendered as a page of the API's origin, never sniffed into one
SAFE_DOWNLOAD = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
                 "Cache-Control": "private, no-store"}  # fmt: skip
FILES_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 507: {"description": "over the tenant's stored-file quota (max_stored_files, max_stored_bytes)"},
}  # fmt: skip

DOWNLOAD_CHUNK = 1 << 20
#: the upload's body as OpenAPI says it (the route reads the request itself: a form or a raw body)
_BINARY = {"type": "string", "format": "binary"}
UPLOAD_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "additionalProperties": _BINARY}},
    "application/octet-stream": {"schema": _BINARY},
}}}  # fmt: skip


def download_headers(record: StoredFile) -> dict[str, str]:
    return {**SAFE_DOWNLOAD, "Content-Disposition": f'attachment; filename="{record.name}"'}


async def receive_upload(rt: TenantRuntime, content_type: str, name: str | None, receive: Receive) -> Received:
    """An upload's files, each spooled into the tenant's store as it arrives. The gate bounds the body by
    ``max_upload_bytes`` (413); the files are bounded by the store's bytes too (507 when that is the smaller:
    they could never be stored). Past a bound receiving stops, and nothing is kept."""
    store, quotas = rt.uploads, rt.config.quotas
    limit = min(quotas.max_upload_bytes, store.max_bytes)
    bounds = Bounds(max_files=max(store.max_files, 1), files_bytes=limit, field_bytes=quotas.max_body_bytes)
    try:
        return await receive_body(content_type, name, body_chunks(receive), lambda n: store.spool(n, limit), bounds)
    except TooLarge as exc:
        if isinstance(exc, TooMany) or store.max_bytes < quotas.max_upload_bytes:
            raise ApiError(507, "quota_exceeded", f"upload refused: over this tenant's stored files' limits "
                                                  f"({exc})") from None  # fmt: skip
        raise ApiError(413, "body_too_large", f"upload refused: {exc}") from None


class FileDownload(Response):
    """A stored file's bytes, read from its file in chunks as they are sent (in a worker thread), never whole."""

    def __init__(self, stream: BinaryIO, record: StoredFile) -> None:
        headers = {**download_headers(record), "Content-Length": str(record.size), "ETag": f'"{record.sha256}"'}
        super().__init__(None, media_type=record.media_type, headers=headers)
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.stream:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            while chunk := await anyio.to_thread.run_sync(self.stream.read, DOWNLOAD_CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def store_upload(store: UploadStore, received: Received) -> list[StoredFile]:
    """All the received files or none (over the quota: 507)."""
    if not received.files:
        received.discard()
        raise ApiError(422, "invalid_request", "body: the form has no file part")
    try:
        return store.commit(received.files, kind="upload")
    except StoreFull as exc:
        raise ApiError(507, "quota_exceeded", str(exc)) from None


def _stream_errors(app: FastAPI, service: Service) -> None:
    """What a route receiving its body as it arrives answers past the bound, or when the client went away."""

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        mark(request, "body_too_large")
        return service.error(413, "body_too_large", "the request body is over this tenant's limit")

    @app.exception_handler(ClientGone)
    async def gone(request: Request, exc: ClientGone) -> JSONResponse:  # nobody reads it: what came was discarded
        mark(request, "client_disconnected")
        return service.error(499, "client_disconnected", "the client went away")


def install(app: FastAPI, service: Service) -> None:
    _stream_errors(app, service)

    @app.post("/v1/files", status_code=201, responses=FILES_ERRORS, tags=["files"], openapi_extra=UPLOAD_BODY)
    async def upload(
        rt: Tenant, request: Request, name: Annotated[str | None, Query(max_length=200)] = None
    ) -> JSONResponse:
        """Store files for later runs (``file_refs`` of ``POST /v1/exec``, MCP ``sandforge://files/ID``): a
        multipart form's file parts (each named by its filename), or a raw body named by ``?name=``. The body
        is written to disk as it arrives (bounded by ``max_upload_bytes``), never held in memory."""
        received = await receive_upload(rt, request.headers.get("content-type", ""), name, request.receive)
        try:
            stored = await service.blocking(lambda: store_upload(rt.uploads, received))
        finally:
            received.discard()
        mark(request, "ok")
        return JSONResponse(service.scrub({"files": [r.listed() for r in stored]}), status_code=201)

    @app.get("/v1/files", responses=ERRORS, tags=["files"])
    async def list_files(rt: Tenant) -> JSONResponse:
        """The tenant's stored files, oldest first: uploads and the kept outputs of its runs."""
        records = await service.blocking(rt.uploads.files)
        return JSONResponse(service.scrub({"files": [r.listed() for r in records]}))

    @app.get("/v1/files/{file_id}", responses=ERRORS, tags=["files"])
    async def download(file_id: str, rt: Tenant, request: Request) -> Response:
        """A stored file's bytes (an attachment of its media type), streamed from disk. ETag: its sha256. A HEAD
        is answered from the file's record, its bytes not opened."""
        if is_head(request):
            record = await service.blocking(lambda: rt.uploads.info(file_id))
            if record is None:
                raise ApiError(404, "not_found", "no such file")
            mark(request, "ok")
            return file_response(record, None, download_headers(record))
        found = await service.blocking(lambda: rt.uploads.open(file_id))
        if found is None:
            raise ApiError(404, "not_found", "no such file")
        record, stream = found
        mark(request, "ok")
        return FileDownload(stream, record)

    @app.delete("/v1/files/{file_id}", status_code=204, responses=ERRORS, tags=["files"])
    async def delete(file_id: str, rt: Tenant, request: Request) -> Response:
        """Remove a stored file."""
        if not await service.blocking(lambda: rt.uploads.delete(file_id)):
            raise ApiError(404, "not_found", "no such file")
        mark(request, "ok")
        return Response(status_code=204)


def clean_all(service: Service) -> None:
    """Every tenant's stored files past their age, removed (``serve``'s start-up); a failure is logged."""
    for tenant in service.config.tenants:
        try:
            service.runtimes.get(tenant.name).uploads  # noqa: B018 (opening a store cleans it)
        except Exception:
            log.warning("stored files of tenant %s not cleaned", tenant.name, exc_info=True)
