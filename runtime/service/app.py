"""The HTTP API of `sandforge serve` (FastAPI): /v1 for tenants, /healthz and /readyz for everyone.

Every /v1 route gets its tenant from the :class:`~sandforge.runtime.service.gate.Gatekeeper` (authentication
and body limits happen there) and reaches only that tenant's runtime, so another tenant's tool, session or
log is simply not found (404). Blocking work (executions, agent calls, the store, files) runs in threads;
executions and agent calls share ``execution_slots`` threads of their own, so the event loop (and /healthz)
never waits for a sandbox. Responses carry no traceback and no host path (:mod:`.scrub`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.guardrails.checking import check_program
from sandforge.runtime.service import auth_challenge, context_api, exec_route, files_api, sessions_api
from sandforge.runtime.service import calls as call_log_reader
from sandforge.runtime.service.audit import AuditLog, AuditRecord, note
from sandforge.runtime.service.deps import ERRORS, ApiError, Service, Tenant, first_error, mark
from sandforge.runtime.service.gate import Gatekeeper
from sandforge.runtime.service.mcp.http import McpEndpoint
from sandforge.runtime.service.memory import Trimmer
from sandforge.runtime.service.models import (
    AgentCallRequest,
    ExecRequest,
    ExecResult,
    Health,
    PolicyCheckRequest,
    Readiness,
)
from sandforge.runtime.service.quotas import seconds_to_utc_midnight
from sandforge.runtime.service.route_table import UNDECODABLE, allowed_methods, undecodable_body
from sandforge.runtime.service.tenants import ServerConfig, TenantRuntimes
from sandforge.sandbox.prestart import prestart

log = logging.getLogger(__name__)
T = TypeVar("T")
API_VERSION = "1"
#: the loop's default executor: asyncio's own bound (``to_thread``: a cold validation, an environment plan)
DEFAULT_EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)


def _install_handlers(app: FastAPI, service: Service) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        mark(request, exc.error_type)
        return service.error(exc.status, exc.error_type, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        mark(request, "invalid_request")
        return service.error(422, "invalid_request", first_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if undecodable_body(exc):  # one kind of bad body, one answer: as invalid JSON or a wrong shape
            mark(request, "invalid_request")
            return service.error(422, "invalid_request", UNDECODABLE)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        mark(request, kind)
        message = "no such resource" if exc.status_code == 404 else str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of every route at this path, not only the first route's
            headers["Allow"] = allowed_methods(request.app.router.routes, request.scope)
        return service.error(exc.status_code, kind, message, headers)

    @app.exception_handler(SandforgeError)
    async def sandforge_error(request: Request, exc: SandforgeError) -> JSONResponse:
        log.warning("request failed: %s", exc)
        mark(request, "unavailable")
        return service.error(503, "unavailable", str(exc))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        mark(request, "internal_error")
        return service.error(500, "internal_error", "internal error (see the server log)")


def _exec_routes(app: FastAPI, service: Service) -> None:
    @app.post("/v1/exec", response_model=ExecResult, responses=ERRORS, tags=["execution"],
              openapi_extra=exec_route.MULTIPART_BODY)  # fmt: skip
    async def run_exec(body: ExecRequest, rt: Tenant, request: Request) -> Response:
        """One program: validated by the tenant's policy, run in a fresh sandbox (``sandforge exec --json``).
        Or a multipart form: a ``request`` field (this JSON) and a file part per input file, streamed."""
        outcome = await exec_route.run_exec(service, rt, body)
        result = await exec_route.http_result(service, rt, outcome)
        mark(request, exec_route.outcome_word(outcome))
        return Response(service.scrub.json_bytes(result), media_type="application/json")

    @app.post("/v1/agents/{role}/{method}", responses=ERRORS, tags=["agents"])
    async def call_agent(role: str, method: str, body: AgentCallRequest, rt: Tenant, request: Request) -> JSONResponse:
        """A dynamic call ``role.method(*args, **kwargs)`` through the full lifecycle with the tenant's provider,
        ToolStore and policy. Returns the ``Outcome`` (failures of the tool are outcomes, not HTTP errors)."""
        note(request.scope.get("state"), tool_role=role, tool_method=method)
        if rt.config.provider.kind != "none" and rt.provider_calls.exhausted:
            wait = seconds_to_utc_midnight()
            raise ApiError(429, "quota_exceeded", "provider call quota reached for today", {"Retry-After": str(wait)})
        workspace = rt.workspace

        def call() -> dict[str, Any]:
            return workspace.call(role, method, *body.args, **body.kwargs).model_dump(mode="json")

        try:
            outcome = await service.execute(rt, call)
        except (TypeError, ValueError) as exc:
            raise ApiError(422, "invalid_request", str(exc).splitlines()[0] if str(exc) else "invalid call") from None
        await service.store_changed(rt.name)
        mark(request, "ok" if outcome["status"] == "ok" else outcome.get("error_type") or "error")
        return JSONResponse(service.scrub(outcome))

    @app.post("/v1/policy/check", responses=ERRORS, tags=["policy"])
    async def policy_check(body: PolicyCheckRequest, rt: Tenant, request: Request) -> JSONResponse:
        """The ``sandforge policy check --format json`` report of a program under the tenant's policy."""
        policy = rt.policy
        checked = await service.blocking(lambda: check_program(body.code, policy))
        mark(request, checked.result.verdict)
        extra = {"declared": list(checked.declared), "pending_imports": list(checked.pending)}
        return JSONResponse(service.scrub({**checked.result.model_dump(mode="json"), **extra}))


def _store_routes(app: FastAPI, service: Service) -> None:
    @app.get("/v1/tools", responses=ERRORS, tags=["tools"])
    async def list_tools(rt: Tenant) -> JSONResponse:
        """Every tool in the tenant's ToolStore (``sandforge tools list --json``)."""
        tools = await service.blocking(rt.tool_store.list_tools)
        return JSONResponse(service.scrub([t.model_dump(mode="json") for t in tools]))

    @app.get("/v1/tools/{role}", responses=ERRORS, tags=["tools"])
    async def get_tool(role: str, rt: Tenant) -> JSONResponse:
        """A tool's contract and its methods' health (``sandforge tools show ROLE --json``)."""

        def read() -> dict[str, Any] | None:
            entry = rt.tool_store.get_tool(role)
            if entry is None:
                return None
            report = rt.tool_store.health_report([role])
            return {
                "tool": entry.model_dump(mode="json"),
                "methods": [h.model_dump(mode="json", exclude={"artifact"}) for h in report],
            }

        payload = await service.blocking(_not_found_on_bad_name(read))
        if payload is None:
            raise ApiError(404, "not_found", "no such tool")
        return JSONResponse(service.scrub(payload))

    @app.get("/v1/tools/{role}/{method}", responses=ERRORS, tags=["tools"])
    async def get_method(role: str, method: str, rt: Tenant) -> JSONResponse:
        """One method's current artifact, code included, and its health (``sandforge tools show ROLE METHOD``)."""
        from sandforge.runtime.store.selection import assess_health, reuse_allowed

        def read() -> dict[str, Any] | None:
            store = rt.tool_store
            art = store.lookup(role, method).artifact
            if art is None:
                return None
            reusable, _why = reuse_allowed(art, method, store.policy.dynamic_methods)
            payload = art.model_dump(mode="json")
            health = assess_health(art, policy=store.policy).value
            return payload | {"checksum_ok": art.checksum_ok(), "health": health, "reusable": reusable}

        payload = await service.blocking(_not_found_on_bad_name(read))
        if payload is None:
            raise ApiError(404, "not_found", "no such tool method")
        return JSONResponse(service.scrub(payload))


def _call_routes(app: FastAPI, service: Service) -> None:
    @app.get("/v1/calls", responses=ERRORS, tags=["calls"])
    async def list_calls(
        rt: Tenant,
        role: str | None = None,
        status: Annotated[str | None, Query(pattern="^(ok|error)$")] = None,
        trace: Annotated[str | None, Query(max_length=64)] = None,
        last: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> JSONResponse:
        """The tenant's call log, filtered like ``sandforge logs --json`` (the last ``last`` matching records)."""
        records = await service.blocking(
            lambda: call_log_reader.select(rt.call_log_path, last=last, role=role, status=status, trace=trace)
        )
        return JSONResponse(service.scrub(records))


def _not_found_on_bad_name(fn: Callable[[], T | None]) -> Callable[[], T | None]:
    """A name the store refuses is a resource that does not exist (never a hint about the store's rules)."""
    from sandforge.runtime.store.errors import InvalidNameError, ToolNotFoundError

    def run() -> T | None:
        try:
            return fn()
        except (InvalidNameError, ToolNotFoundError):
            return None

    return run


def _health_routes(app: FastAPI, service: Service, gate: Gatekeeper) -> None:
    @app.get("/healthz", response_model=Health, tags=["health"], responses={503: {"model": Health}})
    async def healthz() -> JSONResponse:
        """Liveness, without authentication; answers from the event loop even when every slot is busy."""
        if gate.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": Readiness}})
    async def readyz() -> JSONResponse:
        """Readiness: each configured backend ran a trivial program recently (cached a few seconds)."""
        report = await anyio.to_thread.run_sync(service.readiness.check)
        ready = all(v == "ok" for v in report.values()) and not gate.draining
        body = {"status": "ready" if ready else "not_ready", "backends": service.scrub(report)}
        return JSONResponse(body, status_code=200 if ready else 503)


def create_app(config: ServerConfig, *, audit: AuditLog | None = None, config_path: Path | None = None) -> FastAPI:
    """The ASGI app (wrapped in its gatekeeper: use ``app.state.gate`` as the ASGI callable). With
    ``config_path``, token changes in that file apply to the running server."""
    runtimes = TenantRuntimes(config, config_path=config_path)
    audit = audit if audit is not None else AuditLog(config.audit_path)
    service = Service(config, runtimes, audit)

    mcp_endpoint = McpEndpoint(service)  # /mcp: streamable HTTP MCP, per tenant (h-mcp)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        trimmer = steady_process()
        await anyio.to_thread.run_sync(files_api.clean_all, service)  # stored files past their age, at start-up
        async with mcp_endpoint.running():
            yield
        await trimmer.stop()
        await shutdown(service)
        # the dashboard's call-log index builders stop after their current batch (the next process resumes)
        await anyio.to_thread.run_sync(app.state.dashboard.close)

    app = FastAPI(
        title="sandforge", version=API_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="Run LLM-generated tool programs in disposable sandboxes, per tenant. See docs/serve.md.",
    )  # fmt: skip
    gate = Gatekeeper(app, runtimes, audit)
    gate.direct[("POST", "/v1/exec")] = exec_route.ExecFastPath(service)
    gate.streamed[("POST", "/v1/exec")] = exec_route.ExecFastPath(service).multipart  # inputs streamed to disk
    gate.streamed[("POST", "/v1/files")] = None  # the route receives its body itself (files_api)
    app.state.service = service
    app.state.gate = gate
    _install_handlers(app, service)
    _exec_routes(app, service)
    _store_routes(app, service)
    _call_routes(app, service)
    _health_routes(app, service, gate)
    sessions_api.install(app, service)
    context_api.install(app, service)
    files_api.install(app, service)
    auth_challenge.install(app)  # OAuth clients' probes: told to send a bearer token (no OAuth here)
    app.add_route("/mcp", mcp_endpoint, include_in_schema=False)  # type: ignore[arg-type]  # an ASGI app
    _install_dashboard(app, service)  # /dashboard pages, /v1/dashboard twins (h-dash)
    return app


def _install_dashboard(app: FastAPI, service: Service) -> None:
    from sandforge.runtime.dashboard.common import Dashboard
    from sandforge.runtime.dashboard.mount import install

    audit = service.audit
    dash = Dashboard(for_token=service.runtimes.for_token, scrub=service.scrub,
                     audit=lambda fields: audit.write(AuditRecord(**fields)))  # fmt: skip
    install(app, dash)
    app.state.dashboard = dash


def steady_process() -> Trimmer:
    """What keeps the server's thread count and memory flat under load (docs/serve.md, "Memory and
    threads"): the loop's default executor (cold validations, worker starts outside a pool) with every thread
    started now, and a :class:`Trimmer` giving freed heap pages back every ``TRIM_INTERVAL_S``."""
    default = ThreadPoolExecutor(DEFAULT_EXECUTOR_THREADS, thread_name_prefix="sandforge-default")
    asyncio.get_running_loop().set_default_executor(default)
    prestart(default)
    trimmer = Trimmer(default)
    trimmer.start()
    return trimmer


async def shutdown(service: Service) -> None:
    """Let executions still running finish (each ends by its own timeout at the latest), then close every
    tenant's runtime: warm pools, workers and containers go with it."""
    longest = max((t.quotas.max_timeout_s for t in service.config.tenants), default=30.0)
    grace = service.config.shutdown_grace_s + longest + 5.0
    if not await service.wait_idle(grace):
        log.warning("%d executions still running at shutdown", service.in_flight)
    service.pool.shutdown(wait=False, cancel_futures=True)
    await anyio.to_thread.run_sync(service.runtimes.close)
    await anyio.to_thread.run_sync(service.readiness.close)
    service.audit.close()
