"""What the app's route table answers for a request no route takes: the methods a path allows (``Allow`` on
every 405, RFC 9110 section 15.5.6), and whether a 400 of the framework was a body it could not decode.

Both are read from the routes themselves, so every route added later is covered without a list to update
(tests/service/test_http_edges.py sweeps the table)."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from sandforge.runtime.service.head import with_head

#: what FastAPI raises as a 400 when a JSON body is not UTF-8 (its JSON syntax errors are validation errors)
UNDECODABLE = "body: not UTF-8 JSON"


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """Every method some route takes at the request's path (several routes may share a path, one method each)."""
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(with_head(methods)))  # the gatekeeper answers HEAD wherever GET


def undecodable_body(exc: HTTPException) -> bool:
    """FastAPI's 400 for a body it could not read as JSON text (not UTF-8): the same kind of bad body as
    invalid JSON, so it gets the same answer (422 ``invalid_request``)."""
    return exc.status_code == 400 and isinstance(exc.__cause__, ValueError)
