"""Typed failures of a brokered request. The program sees them as exceptions (all `FetchError`), the
lifecycle as outcome types (`LIFECYCLE`). Messages never carry a credential: the broker builds them from
the normalised URL (which has no userinfo) and redacts every credential value it used. One family with the
environments' failures (``runtime.host_failures``): each kind is an ``ErrorType`` value and carries its lane."""

from __future__ import annotations

from typing import ClassVar, Literal

from sandforge.runtime.host_failures import HostFailure, Lane, tables

ErrorKind = Literal["egress_denied", "egress_limit", "network_error", "missing_credentials", "invalid_fetch"]


class FetchError(HostFailure):
    """Base of every failure of a brokered request."""

    kind: ClassVar[ErrorKind] = "network_error"
    lane: ClassVar[Lane] = Lane(terminal=False, retriable=True, counts_against_health=False)


class EgressDenied(FetchError):
    """The policy does not allow this request (URL, method, scheme, port, address, header override).
    Terminal: another way of asking for the same thing will not be allowed either."""

    kind = "egress_denied"
    lane = Lane(terminal=True, retriable=False, counts_against_health=False)


class EgressLimit(FetchError):
    """A budget of the execution is spent: response size, total bytes, request count, redirects."""

    kind = "egress_limit"
    lane = Lane(terminal=False, retriable=False, counts_against_health=True)


class NetworkError(FetchError):
    """DNS failure, refused or reset connection, TLS failure, timeout. A 5xx status is not an error."""

    kind = "network_error"


class MissingCredentials(FetchError):
    """The policy injects a credential the host does not have (unset variable, unreadable file)."""

    kind = "missing_credentials"
    lane = Lane(terminal=True, retriable=False, counts_against_health=False)


class InvalidFetch(FetchError):
    """The request itself is malformed (not a URL, a method that is not a token, a body that is not
    base64): the program can fix it."""

    kind = "invalid_fetch"
    lane = Lane(terminal=False, retriable=False, counts_against_health=True)


#: kind -> class, and how the lifecycle treats each kind when the program does not catch it (ADR 0016's
#: classes): (terminal, retriable, counts against the artifact's health).
ERRORS, LIFECYCLE = tables((EgressDenied, EgressLimit, NetworkError, MissingCredentials, InvalidFetch))
