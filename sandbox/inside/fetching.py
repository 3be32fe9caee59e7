"""Brokered egress, the program's side: ``fetch()``, its ``Response`` and ``FetchError`` family.

The sandbox has no network: ``fetch`` sends a ``fetch`` frame (the request as JSON) to the host over the
channel nested calls use, and the host's broker decides, makes the request itself and answers with a
``fetch_result`` frame (status, headers, final URL) followed by the body as one raw frame: bytes the program
gets, never parsed by the host or the inside. A failure the broker reports is raised as the matching
``FetchError`` subclass; a program that does not catch it ends with its kind as the error type (the host
checks it really answered so). The ``urllib.request`` and ``requests`` stand-ins (``standins``) are built on
``fetch``.
"""

from __future__ import annotations

import base64
import codecs
import http
import json as _json
from collections.abc import Callable
from typing import Any

#: Charsets web pages name most, looked up now: after a lock-down that changes the root (the subprocess
#: backend) no codec module can be imported, and ``Response.text`` would fall back to UTF-8.
for _charset in ("latin-1", "cp1252", "ascii", "utf-16", "utf-8-sig", "iso-8859-15", "iso-8859-2"):
    codecs.lookup(_charset)

#: Longest URL, most headers and longest header value a request may carry (the broker's own bounds).
MAX_URL_CHARS = 8192
MAX_HEADERS = 64
MAX_HEADER_VALUE = 8192


class FetchError(Exception):
    """A brokered request failed (``kind`` says how; ``reason`` is the broker's short code)."""

    kind = "network_error"

    def __init__(self, message: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.kind


class EgressDenied(FetchError):
    """The policy does not allow this request. Another way of asking for it will not be allowed either."""

    kind = "egress_denied"


class EgressLimit(FetchError):
    """An egress budget of this execution is spent: response size, total bytes, request count, time."""

    kind = "egress_limit"


class NetworkError(FetchError):
    """DNS failure, refused or reset connection, TLS failure, timeout. A 5xx status is a response."""

    kind = "network_error"


class MissingCredentials(FetchError):
    """The policy injects a credential the host does not have."""

    kind = "missing_credentials"


class InvalidFetch(FetchError):
    """The request is malformed (not a URL, a method that is not supported, a bad header)."""

    kind = "invalid_fetch"


ERRORS: dict[str, type[FetchError]] = {
    cls.kind: cls for cls in (EgressDenied, EgressLimit, NetworkError, MissingCredentials, InvalidFetch)
}


_KINDS: dict[type, str] = {FetchError: FetchError.kind, **{cls: kind for kind, cls in ERRORS.items()}}


def error_kind(exc: BaseException) -> str | None:
    """The kind of a ``FetchError`` the program did not catch, read from the runner's own classes (a
    subclass's ``kind`` attribute is the program's to set, so it is not trusted)."""
    for cls in type(exc).__mro__:
        kind = _KINDS.get(cls)
        if kind is not None:
            return kind
    return None


class Response:
    """What ``fetch`` returns: ``status``, ``headers`` (lower-case names), ``url`` (the final one),
    ``content`` (bytes), ``text``, ``json()``, ``ok``."""

    __slots__ = ("content", "elapsed_ms", "headers", "status", "url")

    def __init__(self, status: int, headers: dict[str, str], url: str, content: bytes, elapsed_ms: float) -> None:
        self.status, self.headers, self.url, self.content, self.elapsed_ms = status, headers, url, content, elapsed_ms

    @property
    def ok(self) -> bool:
        return self.status < 400

    @property
    def reason(self) -> str:
        try:
            return http.HTTPStatus(self.status).phrase
        except ValueError:
            return ""

    @property
    def encoding(self) -> str:
        """The charset the ``content-type`` header names (UTF-8 when it names none)."""
        return charset_of(self.headers.get("content-type", "")) or "utf-8"

    @property
    def text(self) -> str:
        try:
            return self.content.decode(self.encoding, "replace")
        except LookupError:
            return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return _json.loads(self.content)

    def __repr__(self) -> str:
        return f"<Response [{self.status}] {self.url}>"


def charset_of(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        name, _, value = part.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"').strip("'")
    return None


# --- building the request --------------------------------------------------------------------------------


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"fetch(): {what} must be a string, not {type(value).__name__}")
    return str(value)


def _headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, dict) else headers
    if not isinstance(items, list | tuple) and not isinstance(headers, dict):
        raise TypeError(f"fetch(): headers must be a dict, not {type(headers).__name__}")
    out: dict[str, str] = {}
    for pair in items:
        name, value = pair
        out[_text(name, "a header name")] = _text(value, f"header {name!r}")
    if len(out) > MAX_HEADERS:
        raise ValueError(f"fetch(): at most {MAX_HEADERS} headers")
    return out


def _params(params: Any) -> dict[str, Any] | None:
    """``params`` as the wire carries them: name -> text or list of texts (a dict, or a list of pairs)."""
    if params is None:
        return None
    if isinstance(params, str | bytes):
        raise TypeError("fetch(): params must be a dict or a list of (name, value) pairs, not a query string")
    items = params.items() if isinstance(params, dict) else params
    out: dict[str, list[str]] = {}
    for name, value in items:
        if value is None:
            continue
        key = _text(name, "a parameter name")
        values = value if isinstance(value, list | tuple) else [value]
        out.setdefault(key, []).extend(_text(v, f"parameter {key!r}") for v in values)
    return {key: values[0] if len(values) == 1 else values for key, values in out.items()}


def _body(body: Any, json: Any, headers: dict[str, str]) -> bytes | None:
    if body is not None and json is not None:
        raise TypeError("fetch(): give body or json, not both")
    if json is not None:
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
        return _json.dumps(json, ensure_ascii=False, allow_nan=False).encode()
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    raise TypeError(f"fetch(): body must be bytes or str, not {type(body).__name__}")


def _timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, tuple | list) and len(timeout) == 2:  # requests' (connect, read): the sum bounds both
        timeout = sum(_timeout(part) or 0.0 for part in timeout) or None
        return None if timeout is None else float(timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 600:
        raise ValueError(f"fetch(): timeout must be a number of seconds in (0, 600], not {timeout!r}")
    return float(timeout)


def build_request(
    url: Any, method: Any = "GET", headers: Any = None, params: Any = None, body: Any = None, json: Any = None,
    timeout: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """The wire request (``runtime/egress/wire.py``'s ``FetchRequest`` fields). TypeError/ValueError for
    arguments that cannot be one; everything the policy judges is the broker's to refuse."""
    if not isinstance(url, str):
        raise TypeError(f"fetch(): url must be a string, not {type(url).__name__}")
    if not url or len(url) > MAX_URL_CHARS:
        raise ValueError(f"fetch(): the url must be 1 to {MAX_URL_CHARS} characters")
    if not isinstance(method, str) or not 0 < len(method) <= 16:
        raise ValueError("fetch(): method must be a short string such as 'GET' or 'POST'")
    wire_headers = _headers(headers)
    data = _body(body, json, wire_headers)
    request: dict[str, Any] = {"method": method.upper(), "url": url, "headers": wire_headers}
    wire_params = _params(params)
    if wire_params is not None:
        request["params"] = wire_params
    if data is not None:
        request["body_b64"] = base64.b64encode(data).decode("ascii")
    wire_timeout = _timeout(timeout)
    if wire_timeout is not None:
        request["timeout_s"] = wire_timeout
    return request


# --- the exchange with the host ----------------------------------------------------------------------------

#: Sends one wire request to the host, returns the ``fetch_result`` frame and the body (set by ``bind``).
Sender = Callable[[dict[str, Any]], tuple[dict[str, Any], bytes]]
_SENDER: list[Sender] = []


def bind(sender: Sender | None) -> None:
    """The execution's way to the host (one runner process serves one execution); None: no way."""
    _SENDER[:] = [] if sender is None else [sender]


def send(request: dict[str, Any]) -> Response:
    """One brokered request: the host's response, or the broker's failure raised as a ``FetchError``."""
    if not _SENDER:
        raise NetworkError("fetch() is not available outside an execution", reason="internal")
    reply, body = _SENDER[0](request)
    error = reply.get("error")
    if isinstance(error, dict):
        kind = error.get("kind")
        cls = ERRORS.get(kind if isinstance(kind, str) else "", NetworkError)
        raise cls(str(error.get("message") or kind), reason=str(error.get("reason") or ""))
    response = reply.get("response")
    if not isinstance(response, dict):
        raise RuntimeError("host sent a malformed fetch reply")
    headers = response.get("headers")
    return Response(
        int(response.get("status") or 0),
        {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {},
        str(response.get("url") or request["url"]),
        body,
        float(response.get("elapsed_ms") or 0.0),
    )


def fetch(
    url: Any, *, method: Any = "GET", headers: Any = None, params: Any = None, body: Any = None, json: Any = None,
    timeout: Any = None,
) -> Response:  # fmt: skip
    """Ask the host to make an HTTP(S) request under its egress policy. Raises ``EgressDenied``,
    ``EgressLimit``, ``NetworkError`` (all ``FetchError``); a 4xx/5xx status is a response, not an error."""
    return send(build_request(url, method, headers, params, body, json, timeout))
