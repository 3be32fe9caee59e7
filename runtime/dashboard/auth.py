"""The dashboard's browser session: a token kept in a cookie, and CSRF tokens bound to it.

The login page takes an API token (the one ``sandforge tokens create`` gave) and keeps it in a cookie that
is ``HttpOnly`` (no script reads it), ``Secure`` (never sent over plain HTTP, except to loopback, which
browsers treat as secure), ``SameSite=Strict`` (never sent with a request another site starts) and scoped to
``/dashboard``. Every request authenticates the cookie's token again, so a revoked token logs the browser
out at once. State-changing requests (rollback, logout) also need a CSRF token: an HMAC of the session's
token hash under a per-process secret, so it is worthless without that session's cookie, and a form from
another tenant's session does not work in this one. Requests whose ``Origin`` or ``Sec-Fetch-Site`` say
they come from another site are refused before that.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from urllib.parse import parse_qs

from starlette.requests import Request

COOKIE = "sf_dashboard"
COOKIE_PATH = "/dashboard"
SESSION_S = 12 * 3600
MAX_FORM_BYTES = 16 * 1024
LOGIN_CODE_S = 600
#: scope key the service's gatekeeper sets when the GET a route sees answers a HEAD (``service/head.py``):
#: a GET with an effect skips it then (a HEAD of a login link does not use up its code)
HEAD_REQUEST = "sandforge.head"


def is_head(request: Request) -> bool:
    """Whether this GET answers a HEAD: its body is dropped, so a route may skip the work of building it."""
    return bool(request.scope.get(HEAD_REQUEST))


class Sessions:
    """CSRF tokens for sessions and one-time login codes (``sandforge dashboard`` prints one in its URL)."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self._codes: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def csrf(self, token: str) -> str:
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        return hmac.new(self._secret, b"csrf:" + digest, hashlib.sha256).hexdigest()

    def csrf_ok(self, token: str, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(self.csrf(token), presented)

    def add_login_code(self, token: str) -> str:
        """A code that logs one browser in with ``token`` once, within LOGIN_CODE_S."""
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = (token, time.monotonic() + LOGIN_CODE_S)
        return code

    def redeem(self, code: str, *, consume: bool = True) -> str | None:
        """The code's token while it is valid; ``consume=False`` (a HEAD of the link) leaves the code usable."""
        with self._lock:
            found = next((c for c in self._codes if hmac.compare_digest(c, code)), None)
            entry = None if found is None else self._codes.pop(found) if consume else self._codes[found]
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]


def cookie_header(token: str) -> str:
    return f"{COOKIE}={token}; Path={COOKIE_PATH}; Max-Age={SESSION_S}; HttpOnly; Secure; SameSite=Strict"


def clear_cookie_header() -> str:
    return f"{COOKIE}=; Path={COOKIE_PATH}; Max-Age=0; HttpOnly; Secure; SameSite=Strict"


def cross_site(request: Request) -> bool:
    """True when the browser says another site started this request (Origin or Sec-Fetch-Site)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    if origin == "null":  # an opaque origin (a sandboxed frame, a data: page): never this site
        return True
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] != host


async def form(request: Request) -> dict[str, str] | None:
    """An urlencoded form body (first value of each field), None when it is too large or not a form."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20)
    return {k: v[0] for k, v in fields.items()}
