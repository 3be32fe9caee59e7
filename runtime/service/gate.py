"""The ASGI gatekeeper in front of the app: authentication, body limits, draining, and the audit record.

For every request under ``/v1`` and ``/mcp`` it resolves ``Authorization: Bearer <token>`` to a tenant
(401 otherwise, the same answer for a missing, wrong or revoked token), refuses a body over the tenant's
``max_body_bytes`` (413: by Content-Length before reading, else while reading it, before the app sees any
of it), answers 503 once the server is draining, and puts the :class:`TenantRuntime` in
``scope["state"]["tenant"]`` for the routes (h-mcp's ``/mcp`` app reads it there too).
Every such request gets one audit line. Every request (any path) that is a HEAD is answered as its GET
without the body (:mod:`.head`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from sandforge.runtime.service.audit import AuditLog, AuditRecord, mcp_fields, note
from sandforge.runtime.service.auth_challenge import challenge
from sandforge.runtime.service.head import as_get
from sandforge.runtime.service.tenants import TenantRuntime, TenantRuntimes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: a direct route: (the tenant, the request body, the request's state) -> (status, JSON body, headers)
DirectHandler = Callable[[TenantRuntime, bytes, dict[str, Any]], Awaitable[tuple[int, bytes, dict[str, str]]]]

PROTECTED = ("/v1/", "/mcp")
#: ``scope["state"]`` key: the task of a direct route's request, which the HTTP protocol cancels when the client
#: goes away before the answer started (``coalesce.CoalescingHttpProtocol.connection_lost``)
REQUEST_TASK = "request_task"
#: ``scope["state"]`` key set by the protocol when it cancelled the request because the client went away
DISCONNECTED = "client_disconnected"


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client went away while its body was being received (``http.disconnect``)."""


#: a route that receives its body itself, streamed (an upload): (the tenant, the scope, a receive bounded by
#: ``max_upload_bytes``, the request's state) -> (status, JSON body, headers)
StreamHandler = Callable[[TenantRuntime, Scope, Receive, dict[str, Any]], Awaitable[tuple[int, bytes, dict[str, str]]]]
#: the content types a streamed route streams (any other body is read here, bounded by ``max_body_bytes``)
STREAMED_TYPES = (b"multipart/form-data", b"application/octet-stream")


async def body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """A request body's chunks as they arrive; ClientGone when the client goes away first."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def bounded(receive: Receive, limit: int) -> Receive:
    """``receive`` raising BodyTooLarge once the body passes ``limit`` bytes: nothing past the first chunk over
    it is read."""
    seen = 0

    async def limited() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge
        return message

    return limited


def error_bytes(error_type: str, message: str) -> bytes:
    return json.dumps({"error": {"type": error_type, "message": message}}).encode("utf-8")


async def send_bytes(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """One whole JSON response."""
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send, status: int, error_type: str, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_bytes(send, status, error_bytes(error_type, message), headers)


def bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def path_of(scope: Scope) -> str:
    path: str = scope.get("path", "")
    return path


def header_value(scope: Scope, name: bytes) -> bytes:
    """A request header's value (the first), or b""."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return b""


def wants_events(scope: Scope) -> bool:
    """The request accepts server-sent events (``Accept: text/event-stream``): a route that can stream does."""
    return any(name == b"accept" and b"text/event-stream" in value.lower() for name, value in scope.get("headers", ()))


def content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class Gatekeeper:
    """See the module docstring. ``draining`` is set by the server when shutdown begins."""

    def __init__(self, app: ASGIApp, runtimes: TenantRuntimes, audit: AuditLog) -> None:
        self.app = app
        self.runtimes = runtimes
        self.audit = audit
        self.draining = False
        #: (method, path) -> a handler answering that route itself, given the tenant and the body read here
        #: (``exec_route.ExecFastPath``: the hot path without the framework's per-request work)
        self.direct: dict[tuple[str, str], DirectHandler] = {}
        #: (method, path) of routes that receive a multipart or raw body themselves, as it arrives (uploads),
        #: bounded here by ``max_upload_bytes``: a handler answering it, or None for the app's own route
        self.streamed: dict[tuple[str, str], StreamHandler | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "")
        scope, send = as_get(scope, send)  # HEAD wherever GET: the GET's answer without its body
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(PROTECTED):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        state["request_id"] = uuid.uuid4().hex[:16]
        status: dict[str, int] = {"code": 500}
        sent = {"started": False}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                sent["started"] = True
            await send(message)

        try:
            await self._guarded(scope, receive, tracking_send, state)
        except BodyTooLarge:
            state["outcome"] = "body_too_large"
            if not sent["started"]:
                await send_error(tracking_send, 413, "body_too_large", "the request body is over this tenant's limit")
        except (asyncio.CancelledError, ClientGone) as exc:
            # nobody to answer: its execution was ended and cleaned up, what it sent discarded; quietly done
            if isinstance(exc, ClientGone) or state.get(DISCONNECTED):
                state["outcome"], status["code"] = "client_disconnected", 499
                return
            if not self.draining:
                raise
            # the grace period is over and uvicorn cancelled the request (an awaited execution was ended and
            # cleaned up as a timeout would be): a typed answer, not a 500 and a traceback in the log
            state["outcome"] = "shutting_down"
            if not sent["started"]:
                message = "the server shut down before this request ended"
                await send_error(tracking_send, 503, "shutting_down", message, [(b"connection", b"close")])
        finally:
            tenant = state.get("tenant")
            client = scope.get("client")
            self.audit.write(
                AuditRecord(
                    request_id=state["request_id"], tenant=tenant.name if tenant is not None else None,
                    method=method, path=path[:512], status=status["code"],
                    outcome=state.get("outcome"), duration_ms=round((time.perf_counter() - started) * 1000, 3),
                    client=client[0] if client else None, **state.get("audit", {}),
                )
            )  # fmt: skip

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, state: dict[str, Any]) -> None:
        if self.draining:
            state["outcome"] = "shutting_down"
            await send_error(send, 503, "shutting_down", "the server is shutting down", [(b"connection", b"close")])
            return
        token = bearer(scope)
        runtime = self.runtimes.for_token(token)
        if runtime is None:
            state["outcome"] = "unauthorized"
            header = (b"www-authenticate", challenge(token is not None).encode())
            await send_error(send, 401, "unauthorized", "a valid bearer token is required", [header])
            return
        state["tenant"] = runtime
        key = (scope.get("method", ""), path_of(scope))
        kind = header_value(scope, b"content-type").split(b";")[0].strip().lower()
        if key in self.streamed and kind in STREAMED_TYPES:
            await self._streamed(self.streamed[key], runtime, scope, receive, send, state)
            return
        limit = runtime.config.quotas.max_body_bytes
        declared = content_length(scope)
        if declared is not None and declared > limit:
            raise BodyTooLarge
        body = await self._read_body(receive, limit)
        if path_of(scope).startswith("/mcp") and body:
            note(state, **mcp_fields(body))
        handler = self.direct.get((scope.get("method", ""), path_of(scope)))
        if handler is not None:
            state[REQUEST_TASK] = asyncio.current_task()  # a client gone before the answer cancels it
            stream = getattr(handler, "stream", None)
            if stream is not None and wants_events(scope):  # progress, then the answer (exec_route.py)
                await stream(runtime, body, state, send)
                return
            status, answer, headers = await handler(runtime, body, state)
            await send_bytes(send, status, answer, [(k.lower().encode(), v.encode()) for k, v in headers.items()])
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _streamed(
        self, handler: StreamHandler | None, runtime: TenantRuntime, scope: Scope, receive: Receive, send: Send,
        state: dict[str, Any],
    ) -> None:  # fmt: skip
        """A body received by its route as it arrives, bounded by ``max_upload_bytes`` (413 at once when its
        declared length is over it, else at the first chunk past it)."""
        limit = runtime.config.quotas.max_upload_bytes
        declared = content_length(scope)
        if declared is not None and declared > limit:
            raise BodyTooLarge
        if handler is None:
            await self.app(scope, bounded(receive, limit), send)
            return
        state[REQUEST_TASK] = asyncio.current_task()
        status, answer, headers = await handler(runtime, scope, bounded(receive, limit), state)
        await send_bytes(send, status, answer, [(k.lower().encode(), v.encode()) for k, v in headers.items()])

    @staticmethod
    async def _read_body(receive: Receive, limit: int) -> bytes:
        """The whole body, at most ``limit`` bytes (BodyTooLarge past it): read before the app sees it, so an
        oversized body is refused the same way whether or not it declared its length."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
