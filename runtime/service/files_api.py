"""A tenant's stored files over HTTP (issue 41): ``POST /v1/files`` (multipart, or a raw body with ``?name=``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``DELETE /v1/files/{id}``. The store is the tenant's own
(:mod:`.uploads`): another tenant's id is not found, as a made-up one is. ``POST /v1/exec`` takes stored
files by reference (``file_refs``) and keeps an ok run's outputs here.

A download is always an attachment with ``nosniff`` and a CSP that forbids everything (``sandbox``): an SVG or
HTML file a program wrote never runs as a page of this origin, whatever its media type says.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from sandforge.runtime.dashboard.auth import is_head
from sandforge.runtime.dashboard.common import file_response
from sandforge.runtime.errors import InputFileError
from sandforge.runtime.files.transfer import check_name
from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, mark
from sandforge.runtime.service.uploads import StoredFile, StoreFull, UploadStore

log = logging.getLogger(__name__)
#: what every download carries: never rendered as a page of the API's origin, never sniffed into one
SAFE_DOWNLOAD = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
                 "Cache-Control": "private, no-store"}  # fmt: skip
FILES_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 507: {"description": "over the tenant's stored-file quota (max_stored_files, max_stored_bytes)"},
}  # fmt: skip

#: the upload's body as OpenAPI says it (the route reads the request itself: a form or a raw body)
_BINARY = {"type": "string", "format": "binary"}
UPLOAD_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "additionalProperties": _BINARY}},
    "application/octet-stream": {"schema": _BINARY},
}}}  # fmt: skip


def download_headers(record: StoredFile) -> dict[str, str]:
    return {**SAFE_DOWNLOAD, "Content-Disposition": f'attachment; filename="{record.name}"'}


def _name(name: str) -> str:
    try:
        return check_name(name, "file name")
    except InputFileError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


async def _parts(request: Request, name: str | None) -> list[tuple[str, bytes]]:
    """The uploaded files: every file part of a multipart form, or the raw body named by ``name``."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        try:
            form = await request.form()
        except Exception as exc:  # python-multipart's parse errors: a bad body, said in one line
            raise ApiError(422, "invalid_request", f"body: not a multipart form ({exc})") from None
        parts = []
        for item in form.values():
            if isinstance(item, UploadFile):
                parts.append((_name(item.filename or ""), await item.read()))
        await form.close()
        if not parts:
            raise ApiError(422, "invalid_request", "body: the form has no file part")
        return parts
    if kind == "application/octet-stream":
        if name is None:
            raise ApiError(422, "invalid_request", "a raw upload needs ?name=FILE_NAME")
        return [(_name(name), await request.body())]
    raise ApiError(422, "invalid_request", "body: send multipart/form-data, or application/octet-stream with ?name=")


def _stored(store: UploadStore, file_id: str, *, head: bool) -> tuple[StoredFile, bytes | None] | None:
    """A file's record and bytes; for a HEAD its record only."""
    if head:
        record = store.info(file_id)
        return None if record is None else (record, None)
    return store.read(file_id)


def _put_all(store: UploadStore, parts: list[tuple[str, bytes]]) -> list[StoredFile]:
    """All the parts or none (over the quota: 507)."""
    try:
        return store.put_all(parts, kind="upload")
    except StoreFull as exc:
        raise ApiError(507, "quota_exceeded", str(exc)) from None


def install(app: FastAPI, service: Service) -> None:
    @app.post("/v1/files", status_code=201, responses=FILES_ERRORS, tags=["files"], openapi_extra=UPLOAD_BODY)
    async def upload(
        rt: Tenant, request: Request, name: Annotated[str | None, Query(max_length=200)] = None
    ) -> JSONResponse:
        """Store files for later runs (``file_refs`` of ``POST /v1/exec``, MCP ``sandforge://files/ID``): a
        multipart form's file parts (each named by its filename), or a raw body named by ``?name=``."""
        parts = await _parts(request, name)
        stored = await service.blocking(lambda: _put_all(rt.uploads, parts))
        mark(request, "ok")
        return JSONResponse(service.scrub({"files": [r.listed() for r in stored]}), status_code=201)

    @app.get("/v1/files", responses=ERRORS, tags=["files"])
    async def list_files(rt: Tenant) -> JSONResponse:
        """The tenant's stored files, oldest first: uploads and the kept outputs of its runs."""
        records = await service.blocking(rt.uploads.files)
        return JSONResponse(service.scrub({"files": [r.listed() for r in records]}))

    @app.get("/v1/files/{file_id}", responses=ERRORS, tags=["files"])
    async def download(file_id: str, rt: Tenant, request: Request) -> Response:
        """A stored file's bytes (an attachment of its media type)."""
        # ETag: its sha256; a HEAD is answered from the file's record, its bytes not read (_stored)
        found = await service.blocking(lambda: _stored(rt.uploads, file_id, head=is_head(request)))
        if found is None:
            raise ApiError(404, "not_found", "no such file")
        record, body = found
        mark(request, "ok")
        return file_response(record, body, download_headers(record))

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
