"""The ``egress:`` section of a policy file, and the effective egress policy after layering.

A policy file's section (`EgressSection`) has every field optional; layers merge into one `EgressPolicy`
(`merge`): allow entries, ranges and credentials accumulate, `resolve` merges host by host, `ca_file` and
each limit take the last value given, and ``reset: true`` forgets what earlier layers said. With no section
at all the policy allows nothing. The guardrails' policy model embeds `EgressSection`, so the published
JSON Schema covers it; this module imports nothing from the rest of sandforge.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
Scheme = Literal["http", "https"]


def _read_only() -> list[Method]:
    return ["GET", "HEAD"]


def _https() -> list[Scheme]:
    return ["https"]


#: ``${NAME}`` (host environment) or ``${file:/absolute/path}`` (a file's content, trailing newline dropped).
REFERENCE = re.compile(r"\$\{(?:file:(?P<file>[^}]+)|(?P<env>[A-Za-z_][A-Za-z0-9_]*))\}")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_HOST_GLOB = re.compile(r"^(\*\.)?([a-z0-9*_-]+(\.[a-z0-9*_-]+)*|\[[0-9a-f:.]+\])$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def normal_host_glob(value: str) -> str:
    host = value.strip().lower().rstrip(".")
    try:  # an internationalised name is matched in its ASCII (punycode) form, as the URL's host is
        host = ".".join(
            label if label.isascii() or label == "*" else label.encode("idna").decode("ascii")
            for label in host.split(".")
        )
    except UnicodeError:
        raise ValueError(f"host pattern {value!r} is not a valid host name") from None
    if not _HOST_GLOB.fullmatch(host) or "**" in host:
        raise ValueError(
            f"host pattern {value!r}: expected a host name, `*.domain` (any sub-domain), `*` inside one "
            "label, or a bracketed IPv6 address"
        )
    return host


class AllowEntry(_Model):
    """One reachable destination. Exactly one of ``url`` (``scheme://host[:port]/path-glob``) and ``host``
    (any path; https on its default port unless ``schemes``/``ports`` say otherwise). In host globs a
    leading ``*.`` matches one or more labels (not the bare domain) and ``*`` elsewhere stays inside one
    label; in path globs ``**`` crosses ``/`` and ``*`` does not. The platform deny list still applies."""

    url: str | None = Field(None, min_length=8, max_length=2048, description="scheme://host[:port]/path-glob")
    host: str | None = Field(None, min_length=1, max_length=253, description="host glob, e.g. *.example.com")
    methods: list[Method] = Field(default_factory=_read_only, min_length=1)
    schemes: list[Scheme] | None = Field(None, min_length=1, description="host entries only; default [https]")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = Field(
        None, min_length=1, description="host entries only; default: the scheme's default port"
    )
    name: str | None = Field(None, min_length=1, max_length=100, description="shown in provenance records")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else normal_host_glob(value)

    @model_validator(mode="after")
    def _one_target(self) -> AllowEntry:
        if (self.url is None) == (self.host is None):
            raise ValueError("an allow entry needs exactly one of `url` and `host`")
        if self.url is not None:
            if self.schemes is not None or self.ports is not None:
                raise ValueError("`schemes` and `ports` belong to `host` entries; a `url` entry states its own")
            match = re.fullmatch(r"(?P<scheme>https?)://(?P<authority>[^/?#]+)(?P<path>/[^?#]*)?", self.url)
            if match is None:
                raise ValueError(f"url pattern {self.url!r}: expected http(s)://host[:port]/path-glob")
            authority = match["authority"]
            host, _, port = authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
            if not host:
                host, port = authority, ""
            normal_host_glob(host)
            if port and not (port.isdigit() and 1 <= int(port) <= 65535):
                raise ValueError(f"url pattern {self.url!r}: bad port {port!r}")
        return self

    def label(self) -> str:
        """How a provenance record names the entry."""
        target = self.url if self.url is not None else f"host {self.host}"
        return f"{self.name} ({target})" if self.name else target


class Credential(_Model):
    """A header the host adds to requests for matching hosts. The value may reference ``${ENV_NAME}`` or
    ``${file:/absolute/path}``; it is resolved on the host when a request needs it, and never enters the
    sandbox, a response, a record, a log line or an error message."""

    host: str = Field(min_length=1, max_length=253, description="host glob the credential is sent to")
    header: str = Field(min_length=1, max_length=128)
    value: str = Field(min_length=1, max_length=8192, description="template with ${ENV} / ${file:/path}")
    schemes: list[Scheme] = Field(default_factory=_https, min_length=1)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return normal_host_glob(value)

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        if not _HEADER_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid header name")
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        for match in REFERENCE.finditer(value):
            path = match["file"]
            if path is not None and not path.startswith("/"):
                raise ValueError("${file:...} needs an absolute path")
        rest = REFERENCE.sub("", value)
        if "${" in rest:
            raise ValueError("malformed reference: use ${ENV_NAME} or ${file:/absolute/path}")
        if any(ch in rest for ch in "\r\n\0"):
            raise ValueError("a credential value may not contain CR, LF or NUL")
        return value


class EgressLimits(_Model):
    """Per-execution budgets, counted across every request of one execution."""

    max_requests: int = Field(20, ge=0, le=10_000, description="requests per execution (redirects excluded)")
    max_response_bytes: int = Field(5 * 1024 * 1024, ge=1, le=1024**3, description="one body, decompressed")
    max_total_bytes: int = Field(20 * 1024 * 1024, ge=1, le=4 * 1024**3, description="all bodies of an execution")
    max_request_bytes: int = Field(1024 * 1024, ge=0, le=256 * 1024 * 1024, description="one request body")
    timeout_s: float = Field(10.0, gt=0, le=600, allow_inf_nan=False, description="one request, redirects included")
    max_redirects: int = Field(5, ge=0, le=30)


class EgressLimitsOverride(_Model):
    max_requests: int | None = Field(None, ge=0, le=10_000)
    max_response_bytes: int | None = Field(None, ge=1, le=1024**3)
    max_total_bytes: int | None = Field(None, ge=1, le=4 * 1024**3)
    max_request_bytes: int | None = Field(None, ge=0, le=256 * 1024 * 1024)
    timeout_s: float | None = Field(None, gt=0, le=600, allow_inf_nan=False)
    max_redirects: int | None = Field(None, ge=0, le=30)


def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(f"{value!r} is not a CIDR range (e.g. 127.0.0.0/8, fd00::/8)") from None


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip().strip("[]")))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None


Cidr = Annotated[str, Field(min_length=2, max_length=64)]


class EgressSection(_Model):
    """The ``egress:`` section of one policy file. Later layers add allow entries, ranges and credentials,
    override ``resolve`` per host, ``ca_file`` and each limit; ``reset: true`` first forgets earlier layers'
    entries (allow, allow_ranges, resolve, ca_file, credentials; not the limits)."""

    reset: bool = Field(False, description="forget earlier layers' entries before applying this section")
    allow: list[AllowEntry] = Field(default_factory=list, description="reachable destinations; empty = none")
    allow_ranges: list[Cidr] = Field(
        default_factory=list, description="CIDRs exempted from the platform deny list (tests, internal services)"
    )
    resolve: dict[str, str] = Field(
        default_factory=dict, description="host -> address overrides (demos and tests); reported by policy check"
    )
    ca_file: str | None = Field(None, min_length=1, description="extra CA certificates (PEM); relative to the file")
    limits: EgressLimitsOverride | None = None
    credentials: list[Credential] = Field(default_factory=list)

    @field_validator("allow_ranges")
    @classmethod
    def _ranges(cls, values: list[str]) -> list[str]:
        return [_network(value) for value in values]

    @field_validator("resolve")
    @classmethod
    def _resolve(cls, values: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for host, address in values.items():
            name = normal_host_glob(host)
            if "*" in name:
                raise ValueError(f"resolve: {host!r}: a host name, not a pattern")
            out[name] = _address(address)
        return out


class EgressPolicy(_Model):
    """The effective egress policy (every layer merged). The default allows nothing."""

    allow: tuple[AllowEntry, ...] = ()
    allow_ranges: tuple[str, ...] = ()
    resolve: dict[str, str] = Field(default_factory=dict)
    ca_file: str | None = None
    limits: EgressLimits = Field(default_factory=EgressLimits)
    credentials: tuple[Credential, ...] = ()

    def merge(self, section: EgressSection, *, ca_file: str | None = None) -> EgressPolicy:
        """This policy with `section` layered on top. ``ca_file`` is the section's CA path already
        resolved by the caller (relative paths are relative to the policy file)."""
        base = EgressPolicy(limits=self.limits) if section.reset else self
        credentials = {(c.host, c.header.lower()): c for c in base.credentials}
        credentials.update({(c.host, c.header.lower()): c for c in section.credentials})
        limits = base.limits
        if section.limits is not None:
            limits = EgressLimits.model_validate(
                {**limits.model_dump(), **section.limits.model_dump(exclude_none=True)}
            )
        return EgressPolicy(
            allow=(*base.allow, *section.allow),
            allow_ranges=tuple(_unique((*base.allow_ranges, *section.allow_ranges))),
            resolve={**base.resolve, **section.resolve},
            ca_file=ca_file or section.ca_file or base.ca_file,
            limits=limits,
            credentials=tuple(credentials.values()),
        )

    @property
    def reachable(self) -> tuple[str, ...]:
        """What the allow entries name, for ``policy check`` and ``doctor``-style listings."""
        return tuple(entry.label() for entry in self.allow)


def _unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        seen.setdefault(value, None)
    return list(seen)
