"""What the routes of the HTTP API share: the :class:`Service`, typed API errors, the tenant dependency."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError

from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.auth_challenge import challenge
from sandforge.runtime.service.models import ErrorBody
from sandforge.runtime.service.quotas import QuotaExceeded, TenantAdmission
from sandforge.runtime.service.readiness import ReadinessProbe
from sandforge.runtime.service.scrub import Scrubber, host_prefixes
from sandforge.runtime.service.tenants import ServerConfig, TenantRuntime, TenantRuntimes
from sandforge.sandbox.prestart import prestart

T = TypeVar("T")
log = logging.getLogger(__name__)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (401, "no, a wrong or a revoked bearer token"),
        (404, "no such resource for this tenant"),
        (413, "the body is over the tenant's max_body_bytes"),
        (422, "a malformed request (typed: invalid_request, limit_exceeded, ...)"),
        (429, "over a quota; see Retry-After"),
        (503, "the server is shutting down"),
    )
}


class ApiError(Exception):
    """An error answer: ``status``, a stable ``error_type`` word, a one-line message."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}


class Service:
    """What the routes share: configuration, tenants, admission counters, execution slots, the audit log."""

    def __init__(self, config: ServerConfig, runtimes: TenantRuntimes, audit: AuditLog) -> None:
        self.config = config
        self.runtimes = runtimes
        self.audit = audit
        self.scrub = Scrubber(
            host_prefixes([config.state_dir, config.audit_path.parent, *map(config.tenant_state_dir, config.tenants)])
        )
        self.admissions = {t.name: TenantAdmission(t.quotas) for t in config.tenants}
        #: the execution slots, whether an execution runs on a thread or is awaited on the loop
        self.slots = asyncio.Semaphore(config.execution_slots)
        #: their threads: a plain pool (one hop each way; anyio's worker threads cost more per call)
        self.pool = ThreadPoolExecutor(config.execution_slots, thread_name_prefix="sandforge-exec")
        prestart(self.pool)  # all of them now: the server's thread count never grows under load
        self.in_flight = 0
        self.readiness = ReadinessProbe(config)
        #: told the tenant's name after an agent call (it may have changed the tenant's store): the MCP endpoint
        self.on_store_change: list[Callable[[str], Awaitable[None]]] = []

    async def store_changed(self, tenant: str) -> None:
        for hook in list(self.on_store_change):
            try:
                await hook(tenant)
            except Exception:  # a listener must never fail the request that changed the store
                log.warning("a store-change listener failed", exc_info=True)

    def error(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        body = {"error": {"type": error_type, "message": self.scrub.text(" ".join(message.split()))}}
        return JSONResponse(body, status_code=status, headers=headers)

    async def execute(self, rt: TenantRuntime, fn: Callable[[], T]) -> T:
        """``fn`` on a thread of the ``execution_slots`` pool, in an execution slot, admitted by the tenant's
        quotas (429 otherwise). The slot and the admission are released when ``fn`` returns, not when the
        request does: a request cancelled meanwhile (its client gone) leaves ``fn`` counted until it ends, so
        quotas and the graceful shutdown see every execution still running."""
        release = await self._enter(rt)
        loop = asyncio.get_running_loop()
        deferred = False
        try:
            work = self.pool.submit(contextvars.copy_context().run, fn)
            return await asyncio.wrap_future(work)
        except asyncio.CancelledError:
            if not work.cancel() and not work.done():  # running: counted until it really ends
                deferred = True
                work.add_done_callback(lambda _: loop.call_soon_threadsafe(release))
            raise
        finally:
            if not deferred:
                release()

    async def execute_async(self, rt: TenantRuntime, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` awaited on the loop, in an execution slot, admitted as :meth:`execute` admits (an
        ``AsyncSandbox`` execution: a cancelled request ends it and its clean-up is awaited before the slot
        is released)."""
        release = await self._enter(rt)
        try:
            return await fn()
        finally:
            release()

    async def _enter(self, rt: TenantRuntime) -> Callable[[], None]:
        """Admit one execution of ``rt`` (429 over its quotas) and wait for a free slot; returns its release."""
        admission = self.admissions[rt.name]
        try:
            admission.admit()
        except QuotaExceeded as exc:
            raise ApiError(429, "quota_exceeded", exc.message, {"Retry-After": str(exc.retry_after_s)}) from None
        self.in_flight += 1
        try:
            await self.slots.acquire()
        except BaseException:
            self.in_flight -= 1
            admission.release()
            raise

        def release() -> None:
            self.slots.release()
            self.in_flight -= 1
            admission.release()

        return release

    async def blocking(self, fn: Callable[[], T]) -> T:
        """Store and file work: a worker thread of the default pool (never an execution slot)."""
        return await anyio.to_thread.run_sync(fn)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no execution runs (graceful shutdown); False if some still ran after ``timeout_s``."""
        with anyio.move_on_after(timeout_s):
            while self.in_flight:
                await anyio.sleep(0.05)
        return self.in_flight == 0


bearer_scheme = HTTPBearer(auto_error=False, description="an API token of `sandforge tokens create TENANT`")


async def tenant_of(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)] = None
) -> TenantRuntime:
    """The tenant the gatekeeper authenticated (the bearer dependency only documents the scheme). Async: a
    plain function would cost every request a hop through the thread pool."""
    rt: TenantRuntime | None = request.scope.get("state", {}).get("tenant")
    if rt is None:  # unreachable behind the gatekeeper; fail closed anyway
        raise ApiError(401, "unauthorized", "a valid bearer token is required", {"WWW-Authenticate": challenge(False)})
    return rt


Tenant = Annotated[TenantRuntime, Depends(tenant_of)]


def mark(request: Request, outcome: str | None) -> None:
    request.scope.setdefault("state", {})["outcome"] = outcome


def first_error(exc: ValidationError | RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    err = errors[0]
    if err.get("type") == "json_invalid":  # FastAPI's: where it stopped, and why
        return f"body: invalid JSON ({err.get('ctx', {}).get('error', 'JSON decode error')})"
    where = ".".join(str(p) for p in err.get("loc", ())) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {err.get('msg', 'invalid')}{more}"
