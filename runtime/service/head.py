"""HEAD wherever GET (RFC 9110 section 9.3.2): the gatekeeper answers a HEAD by running the request as a GET
and sending its status and headers (Content-Type, Content-Length, ETag, ...) without the body.

One mechanism for every route, so a GET route added later answers HEAD without being told to. The app sees a
GET, so nothing runs twice; a GET that would have an effect reads :data:`HEAD_REQUEST` from the scope to
skip it (the dashboard's one-time login link). The copy of the scope keeps the server's own scope a HEAD,
so uvicorn still sends no body either."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sandforge.runtime.dashboard.auth import HEAD_REQUEST

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


def as_get(scope: Scope, send: Send) -> tuple[Scope, Send]:
    """For a HEAD: a GET's scope (marked :data:`HEAD_REQUEST`) and a ``send`` that drops every body byte;
    anything else unchanged."""
    if scope.get("type") != "http" or scope.get("method") != "HEAD":
        return scope, send

    async def headers_only(message: Message) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return  # the last (empty) body message below ends the response
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return {**scope, "method": "GET", HEAD_REQUEST: True}, headers_only


def with_head(methods: set[str]) -> set[str]:
    """The methods a route answers, HEAD included where GET is (what ``Allow`` lists)."""
    return methods | {"HEAD"} if "GET" in methods else methods
