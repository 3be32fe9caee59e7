"""``/mcp`` on the service: streamable HTTP, one MCP server per tenant, the tenant from the bearer token.

The service's gatekeeper authenticates every request under ``/mcp`` (401 for a missing, wrong or revoked
token, 413 for an oversized body) and puts the tenant's runtime in ``scope["state"]["tenant"]``. This app
routes the request to that tenant's own :class:`TenantMCP` and session manager (made on first use), so a
tenant's sessions, tools and persisted methods are unreachable with another tenant's token: a session id of
tenant A presented with B's token is "Session not found", exactly like an id that never existed. Executions
go through the service's admission (the tenant's quotas, the shared execution slots); over a quota the tool
answers an ``isError`` result typed ``quota_exceeded`` with ``retry_after_s``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from pydantic import BaseModel

from sandforge.runtime.service.deps import ApiError, Service
from sandforge.runtime.service.gate import Receive, Scope, Send, send_error
from sandforge.runtime.service.mcp.models import fail
from sandforge.runtime.service.tenants import TenantRuntime

if TYPE_CHECKING:  # the MCP SDK is imported by the first /mcp request, not by every `serve` start (~0.7 CPU-s)
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from sandforge.runtime.service.mcp.server import Executor, TenantMCP

log = logging.getLogger(__name__)


def _executor(service: Service | None, runtime: TenantRuntime) -> Executor:
    async def execute(work: Callable[[], BaseModel]) -> BaseModel:
        if service is None:
            return await anyio.to_thread.run_sync(work)
        try:
            return await service.execute(runtime, work)
        except ApiError as exc:
            details: dict[str, Any] = {}
            if "Retry-After" in exc.headers:
                details["retry_after_s"] = int(exc.headers["Retry-After"])
            raise fail(exc.error_type, exc.message, retriable=exc.status == 429, **details) from None

    return execute


class McpEndpoint:
    """The ASGI app the service routes ``/mcp`` to. Enter :meth:`running` in the app's lifespan."""

    def __init__(self, service: Service | None = None, *, json_response: bool = False) -> None:
        self.service = service
        self.json_response = json_response
        self._managers: dict[str, StreamableHTTPSessionManager] = {}
        self._servers: dict[str, TenantMCP] = {}
        #: the tasks that run each tenant's session manager and tool-list watch (see :meth:`_serve`)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While entered, tenants' session managers and their tool-list watches run; leaving closes every
        session."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            if self.service is not None:
                self.service.on_store_change.append(self.store_changed)
            try:
                yield
            finally:
                if self.service is not None:
                    self.service.on_store_change.remove(self.store_changed)
                tasks.cancel_scope.cancel()
                self._tasks = None
                self._managers.clear()
                self._servers.clear()

    @staticmethod
    async def _serve(manager: StreamableHTTPSessionManager, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Run ``manager`` until :meth:`running` ends, in a task of its own: the manager's cancel scope must be
        left by the task that entered it. (Entered by the first /mcp request's task and left by the lifespan's,
        every shutdown after a first /mcp request logged an ExceptionGroup traceback and skipped closing the
        tenants.)"""
        async with manager.run():
            task_status.started()
            await anyio.sleep_forever()

    async def store_changed(self, tenant: str) -> None:
        """The service ran something that may have changed ``tenant``'s store (an agent call over HTTP):
        its MCP clients hear of it at once, not at the next poll."""
        server = self._servers.get(tenant)
        if server is not None:
            await server.changes.refresh()

    async def _manager(self, runtime: TenantRuntime) -> StreamableHTTPSessionManager | None:
        async with self._lock:
            manager = self._managers.get(runtime.name)
            if manager is None and self._tasks is not None:
                from sandforge.runtime.service.mcp.server import TenantMCP

                server = TenantMCP(runtime, executor=_executor(self.service, runtime))
                server.streamable_http_app(json_response=self.json_response)  # makes its session manager
                manager = server.session_manager
                await self._tasks.start(self._serve, manager)
                self._tasks.start_soon(server.changes.watch)
                self._servers[runtime.name] = server
                self._managers[runtime.name] = manager
            return manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = scope.get("state", {}).get("tenant")
        if not isinstance(runtime, TenantRuntime):  # only reachable without the gatekeeper: fail closed
            await send_error(send, 401, "unauthorized", "a valid bearer token is required")
            return
        manager = await self._manager(runtime)
        if manager is None:
            await send_error(send, 503, "shutting_down", "the MCP endpoint is not running")
            return
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        # sessions belong to the tenant that opened them (the SDK compares this principal on every request)
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=f"tenant:{runtime.name}", scopes=[]))
        await manager.handle_request(scope, receive, send)
