"""Broker-backed stand-ins for ``urllib.request``/``urllib.error`` and ``requests``: the common surface of
both, built on ``fetching.send``, so generated code written by habit runs unchanged (issue 18).

Only the surface in ``SURFACE`` exists; reading any other name of a stand-in (``requests.Session``,
``urllib.request.build_opener``) raises ``NotSupported`` naming what is supported, and so does a keyword
argument outside it (``verify=``, ``auth=``). The guardrails read the same table (``runtime/guardrails``),
so such a program is refused before it runs.
"""

from __future__ import annotations

import json as _json
import types
import urllib.parse
from typing import Any

from .fetching import FetchError, NetworkError, Response, build_request, charset_of, send


class NotSupported(NotImplementedError):
    """A name or argument outside a stand-in's surface (not an AttributeError: ``from requests import
    Session`` must say why, not "cannot import name")."""


#: What each stand-in module offers (the guardrails flag anything else before the program runs).
_REQUESTS_NAMES = "get post put patch delete head options request Response RequestException HTTPError ConnectionError"
SURFACE: dict[str, frozenset[str]] = {
    "urllib.request": frozenset({"urlopen", "Request"}),
    "urllib.error": frozenset({"URLError", "HTTPError"}),
    "requests": frozenset([*_REQUESTS_NAMES.split(), "Timeout", "exceptions"]),
    "requests.exceptions": frozenset({"RequestException", "HTTPError", "ConnectionError", "Timeout"}),
}
#: The keyword arguments each call takes.
REQUESTS_KEYWORDS = frozenset({"params", "headers", "data", "json", "timeout"})
URLOPEN_KEYWORDS = frozenset({"data", "timeout"})


def not_supported(module: str, name: str) -> NotSupported:
    return NotSupported(
        f"{module}.{name} is not supported in the sandbox: the {module} stand-in (requests are made by the "
        f"host's broker) offers {', '.join(sorted(SURFACE[module]))}"
    )


class Headers(dict):  # type: ignore[type-arg]
    """Response headers: lower-case names, looked up case-insensitively (as ``requests``' and
    ``http.client``'s are)."""

    def __getitem__(self, name: Any) -> Any:
        return super().__getitem__(str(name).lower())

    def __contains__(self, name: object) -> bool:
        return super().__contains__(str(name).lower())

    def get(self, name: Any, default: Any = None) -> Any:
        return super().get(str(name).lower(), default)

    def get_content_charset(self, failobj: Any = None) -> Any:
        return charset_of(self.get("content-type", "")) or failobj

    def get_content_type(self) -> str:
        return str(self.get("content-type", "text/plain")).split(";")[0].strip().lower()

    def get_all(self, name: Any, failobj: Any = None) -> Any:
        return [self[name]] if name in self else failobj


# --- requests ---------------------------------------------------------------------------------------------


class RequestException(OSError):
    """``requests.RequestException``: the base of the stand-in's own errors."""

    def __init__(self, *args: Any, response: Any = None) -> None:
        super().__init__(*args)
        self.response = response


class HTTPError(RequestException):
    """``raise_for_status()`` on a 4xx/5xx response."""


class ConnectionError(RequestException):
    """``requests.ConnectionError``."""


class Timeout(RequestException):
    """``requests.Timeout``."""


class RequestsConnectionError(NetworkError, ConnectionError):
    """A broker ``network_error`` through ``requests``: both a ``NetworkError`` and what ``requests`` raises."""


class RequestsTimeout(NetworkError, Timeout):
    """A broker timeout through ``requests``."""


class RequestsResponse:
    """``requests.Response``: ``status_code``, ``ok``, ``text``, ``content``, ``json()``, ``headers``, ``url``,
    ``reason``, ``encoding``, ``raise_for_status()``."""

    __slots__ = ("response",)
    response: Response

    def __init__(self, response: Response) -> None:
        object.__setattr__(self, "response", response)

    status_code = property(lambda self: self.response.status)
    ok = property(lambda self: self.response.ok)
    content = property(lambda self: self.response.content)
    text = property(lambda self: self.response.text)
    url = property(lambda self: self.response.url)
    reason = property(lambda self: self.response.reason)
    encoding = property(lambda self: self.response.encoding)
    headers = property(lambda self: Headers(self.response.headers))

    def json(self, **options: Any) -> Any:
        return _json.loads(self.response.content, **options)

    def raise_for_status(self) -> None:
        status = self.response.status
        if status >= 400:
            kind = "Client" if status < 500 else "Server"
            raise HTTPError(f"{status} {kind} Error: {self.reason} for url: {self.url}", response=self)

    def iter_lines(self, decode_unicode: bool = False) -> Any:
        lines = self.response.text.splitlines() if decode_unicode else self.response.content.splitlines()
        return iter(lines)

    def __bool__(self) -> bool:
        return self.response.ok

    def __repr__(self) -> str:
        return f"<Response [{self.response.status}]>"


def _requests_send(method: str, url: Any, **options: Any) -> RequestsResponse:
    unknown = sorted(set(options) - REQUESTS_KEYWORDS)
    if unknown:
        raise NotSupported(
            f"requests.{method.lower()}({unknown[0]}=...) is not supported in the sandbox: the requests stand-in "
            f"takes {', '.join(sorted(REQUESTS_KEYWORDS))} (redirects, TLS and credentials are the host's broker's)"
        )
    data, body = options.get("data"), None
    headers = dict(options.get("headers") or {})
    if isinstance(data, dict | list | tuple):
        body = urllib.parse.urlencode(data, doseq=True)
        if not any(str(name).lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif data is not None:
        body = data
    request = build_request(url, method, headers, options.get("params"), body, options.get("json"),
                            options.get("timeout"))  # fmt: skip
    try:
        return RequestsResponse(send(request))
    except NetworkError as exc:
        if isinstance(exc, RequestsConnectionError | RequestsTimeout):
            raise
        cls = RequestsTimeout if exc.reason == "timeout" else RequestsConnectionError
        raise cls(exc.message, reason=exc.reason) from None


def _verb(method: str) -> Any:
    def call(url: Any, **options: Any) -> RequestsResponse:
        return _requests_send(method, url, **options)

    call.__name__ = method.lower()
    return call


def _request(method: Any, url: Any, **options: Any) -> RequestsResponse:
    return _requests_send(str(method), url, **options)


# --- urllib ----------------------------------------------------------------------------------------------


class URLError(OSError):
    """``urllib.error.URLError``: ``reason`` says why."""

    def __init__(self, reason: Any) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"<urlopen error {self.reason}>"


class URLNetworkError(NetworkError, URLError):
    """A broker ``network_error`` through ``urlopen``: both a ``NetworkError`` and a ``URLError``."""

    def __init__(self, message: str = "", reason: str = "") -> None:
        NetworkError.__init__(self, message, reason)

    def __str__(self) -> str:
        return f"<urlopen error {self.message}>"


class Request:
    """``urllib.request.Request(url, data=None, headers={}, method=None)``."""

    def __init__(self, url: Any, data: Any = None, headers: Any = None, method: Any = None) -> None:
        if not isinstance(url, str):
            raise TypeError(f"Request(): url must be a string, not {type(url).__name__}")
        self.full_url, self.data, self.method = url, data, method
        self.headers: dict[str, str] = {}
        for name, value in dict(headers or {}).items():
            self.add_header(name, value)

    def add_header(self, key: Any, val: Any) -> None:
        self.headers[str(key).capitalize()] = str(val)

    def has_header(self, key: Any) -> bool:
        return str(key).capitalize() in self.headers

    def get_header(self, key: Any, default: Any = None) -> Any:
        return self.headers.get(str(key).capitalize(), default)

    def get_method(self) -> str:
        return str(self.method) if self.method else ("POST" if self.data is not None else "GET")

    def get_full_url(self) -> str:
        return self.full_url


class HTTPResponse:
    """What ``urlopen`` returns: a file-like body (``read``, ``readline``, iteration, ``with``) with
    ``status``/``code``, ``headers``, ``url``, ``reason``."""

    def __init__(self, response: Response) -> None:
        self.status = self.code = response.status
        self.reason, self.url = response.reason, response.url
        self.headers = self.msg = Headers(response.headers)
        self.content, self.position = response.content, 0

    def read(self, amt: int | None = None) -> bytes:
        end = len(self.content) if amt is None or amt < 0 else min(self.position + amt, len(self.content))
        data = self.content[self.position : end]
        self.position = end
        return data

    def readline(self, limit: int = -1) -> bytes:
        end = self.content.find(b"\n", self.position)
        end = len(self.content) if end < 0 else end + 1
        if limit is not None and limit >= 0:
            end = min(end, self.position + limit)
        return self.read(end - self.position)

    def readlines(self) -> list[bytes]:
        return list(iter(self.readline, b""))

    def __iter__(self) -> Any:
        return iter(self.readline, b"")

    def getcode(self) -> int:
        return self.status

    def geturl(self) -> str:
        return self.url

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)

    def getheaders(self) -> list[tuple[str, str]]:
        return list(self.headers.items())

    def info(self) -> Headers:
        return self.headers

    def close(self) -> None:
        self.position = len(self.content)

    def __enter__(self) -> HTTPResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class URLHTTPError(URLError):
    """``urllib.error.HTTPError``: a 4xx/5xx response, raised by ``urlopen`` (and readable like one)."""

    def __init__(self, response: HTTPResponse) -> None:
        super().__init__(response.reason)
        self.code = self.status = response.status
        self.msg, self.url, self.hdrs = response.reason, response.url, response.headers
        self.headers, self.fp = response.headers, response

    def read(self, amt: int | None = None) -> bytes:
        return self.fp.read(amt)

    def getcode(self) -> int:
        return self.code

    def __str__(self) -> str:
        return f"HTTP Error {self.code}: {self.msg}"


def urlopen(url: Any, data: Any = None, timeout: Any = None, **options: Any) -> HTTPResponse:
    """``urllib.request.urlopen(url_or_request, data=None, timeout=None)``; HTTPError for 4xx/5xx."""
    if options:
        name = sorted(options)[0]
        raise NotSupported(
            f"urllib.request.urlopen({name}=...) is not supported in the sandbox: it takes a URL or Request, "
            "data and timeout (TLS is the host's broker's)"
        )
    req = url if isinstance(url, Request) else Request(url, data)
    body = data if data is not None else req.data
    if body is not None and not isinstance(body, bytes | bytearray | str):
        raise TypeError("urlopen(): POST data should be bytes (use urllib.parse.urlencode(...).encode())")
    request = build_request(req.full_url, req.get_method() if data is None else "POST", req.headers, None, body,
                            None, timeout)  # fmt: skip
    try:
        response = HTTPResponse(send(request))
    except NetworkError as exc:
        if isinstance(exc, URLNetworkError):
            raise
        raise URLNetworkError(exc.message, reason=exc.reason) from None
    if response.status >= 400:
        raise URLHTTPError(response)
    return response


# --- the modules -----------------------------------------------------------------------------------------


def _module(name: str, names: dict[str, Any]) -> types.ModuleType:
    """A stand-in module: exactly ``names``; any other name read is ``NotSupported``."""
    module = types.ModuleType(name)
    vars(module).update(names)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        raise not_supported(name, attr)

    vars(module)["__getattr__"] = __getattr__
    return module


def build() -> dict[str, types.ModuleType]:
    """The stand-in modules, by import name (``requests``, ``requests.exceptions``, ``urllib.request``,
    ``urllib.error``)."""
    errors = {"RequestException": RequestException, "HTTPError": HTTPError, "ConnectionError": ConnectionError,
              "Timeout": Timeout}  # fmt: skip
    exceptions = _module("requests.exceptions", errors)
    verbs = {name: _verb(name.upper()) for name in ("get", "post", "put", "patch", "delete", "head", "options")}
    requests = _module(
        "requests", {**verbs, **errors, "request": _request, "Response": RequestsResponse, "exceptions": exceptions}
    )
    return {
        "requests": requests,
        "requests.exceptions": exceptions,
        "urllib.request": _module("urllib.request", {"urlopen": urlopen, "Request": Request}),
        "urllib.error": _module("urllib.error", {"URLError": URLError, "HTTPError": URLHTTPError}),
    }


__all__ = ["SURFACE", "FetchError", "NotSupported", "build"]
