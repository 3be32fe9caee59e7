"""Typed failures of a brokered request. The program sees them as exceptions (all `FetchError`), the
lifecycle as outcome types (`LIFECYCLE`). Messages never carry a credential: the broker builds them from
the normalised URL (which has no userinfo) and redacts every credential value it used."""

from __future__ import annotations

from typing import Literal

from sandforge.runtime.errors import SandforgeError

ErrorKind = Literal["egress_denied", "egress_limit", "network_error", "missing_credentials", "invalid_fetch"]


class FetchError(SandforgeError):
    """Base of every failure of a brokered request."""

    kind: ErrorKind = "network_error"

    def __init__(self, message: str, *, reason: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason or self.kind


class EgressDenied(FetchError):
    """The policy does not allow this request (URL, method, scheme, port, address, header override).
    Terminal: another way of asking for the same thing will not be allowed either."""

    kind = "egress_denied"


class EgressLimit(FetchError):
    """A budget of the execution is spent: response size, total bytes, request count, redirects."""

    kind = "egress_limit"


class NetworkError(FetchError):
    """DNS failure, refused or reset connection, TLS failure, timeout. A 5xx status is not an error."""

    kind = "network_error"


class MissingCredentials(FetchError):
    """The policy injects a credential the host does not have (unset variable, unreadable file)."""

    kind = "missing_credentials"


class InvalidFetch(FetchError):
    """The request itself is malformed (not a URL, a method that is not a token, a body that is not
    base64): the program can fix it."""

    kind = "invalid_fetch"


ERRORS: dict[str, type[FetchError]] = {
    cls.kind: cls for cls in (EgressDenied, EgressLimit, NetworkError, MissingCredentials, InvalidFetch)
}

#: How the lifecycle treats each kind when the program does not catch it (ADR 0016's classes):
#: (terminal, retriable, counts against the artifact's health).
LIFECYCLE: dict[str, tuple[bool, bool, bool]] = {
    "egress_denied": (True, False, False),
    "missing_credentials": (True, False, False),
    "network_error": (False, True, False),
    "egress_limit": (False, False, True),
    "invalid_fetch": (False, False, True),
}
