"""The egress broker: one program request in, checks, the host's own request out, JSON back.

`EgressBroker` holds what a policy compiles to (allow rules, exempt ranges, the TLS context, credentials)
and is immutable and shared; `EgressSession` is one execution's view of it: its budgets, counted across
every request of that execution, and its provenance records. Sessions never share a lock, so many
executions fetch at once; within one, a lock guards only the counters.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import functools
import ipaddress
import json
import logging
import re
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandforge.runtime.egress.addresses import IPAddress, Verdict, classify, networks
from sandforge.runtime.egress.config import EgressPolicy
from sandforge.runtime.egress.credentials import CredentialSource
from sandforge.runtime.egress.errors import (
    EgressDenied,
    EgressLimit,
    FetchError,
    InvalidFetch,
    NetworkError,
)
from sandforge.runtime.egress.rules import compile_allow, match_rule
from sandforge.runtime.egress.transport import ConnectionPool, Outgoing, exchange
from sandforge.runtime.egress.urls import Target, join, parse_url
from sandforge.runtime.egress.wire import FetchFailure, FetchReply, FetchRequest, FetchResponse
from sandforge.runtime.errors import ConfigError
from sandforge.sandbox.channel import PipedBody

logger = logging.getLogger(__name__)

#: host, port -> the addresses it resolves to. Tests pass their own; the default asks the system once.
Resolver = Callable[[str, int], Sequence[IPAddress]]

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Headers a program may not set: the broker owns the connection, its framing and the Host it checked.
FORBIDDEN_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
        "http2-settings",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
    }
)
#: Replaced by the broker (it decodes what it asked for).
OWNED_HEADERS = frozenset({"accept-encoding"})
#: Never sent to another origin after a redirect.
ORIGIN_BOUND_HEADERS = frozenset({"authorization", "cookie"})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
USER_AGENT = "sandforge-egress/1"
REDACTED = "[redacted]"
#: Addresses whose verdict a broker keeps (see `EgressBroker._verdict`).
VERDICT_CACHE = 4096
_DNS_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="sandforge-egress-dns")


def system_resolver(timeout: float) -> Resolver:
    """getaddrinfo, bounded in time (it runs in a small pool: a hung resolver cannot hold a request)."""

    def resolve(host: str, port: int) -> list[IPAddress]:
        future = _DNS_POOL.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
        try:
            infos = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise NetworkError(f"DNS: resolving {host} timed out", reason="dns") from None
        except (OSError, UnicodeError) as exc:
            raise NetworkError(
                f"DNS: cannot resolve {host} ({getattr(exc, 'strerror', None) or exc})", reason="dns"
            ) from None
        out: list[IPAddress] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in out:
                out.append(address)
        return out

    return resolve


@functools.lru_cache(maxsize=32)
def _tls_context(ca_file: tuple[str, int, int] | None) -> ssl.SSLContext:
    """The system store (plus `ca_file`'s certificates), TLS 1.2 or later. Loading the store costs tens of
    milliseconds, so contexts are shared (an SSLContext is safe to share between threads); a CA file is
    keyed by its modification time and size, so a changed file is loaded again."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=ca_file[0])
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"egress.ca_file {ca_file[0]}: cannot load CA certificates ({exc})") from None
    return context


class EgressRecord(BaseModel):
    """Provenance of one program request, written by the host (the model cannot forge it)."""

    model_config = ConfigDict(extra="forbid")

    method: str
    url: str = Field(description="as requested, normalised, without credentials")
    final_url: str | None = None
    status: int | None = None
    bytes: int = 0
    duration_ms: float = 0.0
    rule: str | None = Field(None, description="the allow entry that matched (the last hop's)")
    denied: str | None = Field(None, description="why the request failed, when it did")
    error: str | None = Field(None, description="the error kind, when it failed")
    redirects: list[str] = Field(default_factory=list, description="each hop's URL after the first")


@dataclasses.dataclass(slots=True)
class _Draft:
    """An `EgressRecord` while its request runs (plain attributes: a pydantic model checks every assignment);
    `EgressRecord.model_construct` takes its fields once the request ended."""

    method: str
    url: str
    final_url: str | None = None
    status: int | None = None
    bytes: int = 0
    duration_ms: float = 0.0
    rule: str | None = None
    denied: str | None = None
    error: str | None = None
    redirects: list[str] = dataclasses.field(default_factory=list)


def _record(draft: _Draft) -> EgressRecord:
    return EgressRecord.model_construct(**{name: getattr(draft, name) for name in _Draft.__slots__})


def _drop(body: bytes | PipedBody) -> None:
    if isinstance(body, PipedBody):
        body.close()


def _scrub(url: str) -> str:
    """A URL for a record when it could not be parsed: userinfo removed, bounded."""
    url = re.sub(r"(?<=//)[^/?#@]*@", "", url)
    return url if len(url) <= 500 else url[:500] + "..."


class EgressBroker:
    """A policy compiled for brokering. Immutable, thread-safe; `session()` per execution."""

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        resolver: Resolver | None = None,
        environ: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.policy = policy
        self._rules = compile_allow(policy)
        self._exempt = networks(policy.allow_ranges)
        self._resolve_overrides = {host: ipaddress.ip_address(a) for host, a in policy.resolve.items()}
        self._resolver = resolver
        self._credentials = CredentialSource(policy.credentials, environ)
        self._ssl = ssl_context or self._context(policy.ca_file)
        #: address -> its verdict under this policy's exempt ranges: `classify` is a pure function of the two
        #: (tens of microseconds for a public address: every deny range is tested), so each address is judged
        #: once per broker. Bounded; the check itself is never skipped, only not repeated.
        self._verdicts: dict[IPAddress, Verdict] = {}
        #: (target, method) -> the label of the allow entry that admits it: `match_rule` is a pure function of
        #: the two and the immutable rules, so an admitted request is matched once per broker (bounded; a
        #: denial is never kept, it is judged again every time).
        self._admitted: dict[tuple[Target, str], str] = {}
        #: Whether the policy injects any credential (most do not: no per-request lookup then).
        self._injects = bool(policy.credentials)

    @staticmethod
    def _context(ca_file: str | None) -> ssl.SSLContext:
        key: tuple[str, int, int] | None = None
        if ca_file:
            try:
                info = Path(ca_file).stat()
            except OSError as exc:
                raise ConfigError(f"egress.ca_file {ca_file}: cannot read it ({exc.strerror})") from None
            key = (ca_file, info.st_mtime_ns, info.st_size)
        return _tls_context(key)

    def session(self, *, deadline: float | None = None) -> EgressSession:
        """Budgets and records for one execution. `deadline` (``time.monotonic()``) is the execution's own:
        time spent fetching counts against it."""
        return EgressSession(self, deadline)

    # --------------------------------------------------------------------------------- one hop's checks

    def _verdict(self, address: IPAddress) -> Verdict:
        verdict = self._verdicts.get(address)
        if verdict is None:
            verdict = classify(address, self._exempt)
            if len(self._verdicts) < VERDICT_CACHE:  # a racing thread may judge it too: the same answer
                self._verdicts[address] = verdict
        return verdict

    def _admit(self, target: Target, method: str) -> str:
        """The label of the allow entry that admits `method` on `target`; `EgressDenied` otherwise."""
        label = self._admitted.get((target, method))
        if label is None:
            label = match_rule(self._rules, target, method).label()
            if len(self._admitted) < VERDICT_CACHE:  # a racing thread may match it too: the same answer
                self._admitted[(target, method)] = label
        return label

    def _addresses(self, target: Target, deadline: float) -> list[Verdict]:
        if target.ip is not None:
            found: Sequence[IPAddress] = [target.ip]
        elif target.host in self._resolve_overrides:
            found = [self._resolve_overrides[target.host]]
        else:
            remaining = max(0.001, deadline - time.monotonic())
            resolver = self._resolver or system_resolver(remaining)
            found = resolver(target.host, target.port)
            if not found:
                raise NetworkError(f"DNS: {target.host} has no address", reason="dns")
        verdicts = [self._verdict(address) for address in found]
        denied = [v for v in verdicts if not v.allowed]
        if denied:
            via = "" if target.ip is not None else f"{target.host} resolves to "
            raise EgressDenied(
                f"{target.url} is denied: {via}{denied[0].reason}; the platform denies such addresses above "
                "every allow entry",
                reason="address",
                hint="retrying another way will not help",
            )
        return verdicts


class EgressSession:
    """One execution's requests: budgets counted across all of them, and a record per request."""

    def __init__(self, broker: EgressBroker, deadline: float | None) -> None:
        self._broker = broker
        self._deadline = deadline
        self._lock = threading.Lock()
        self._requests = 0
        self._total_bytes = 0
        self._records: list[EgressRecord | _Draft] = []
        self._built = 0  # records[:_built] are EgressRecords
        self._secrets: set[str] = set()
        #: Kept-alive connections of this execution only (see `transport`); closed with the session, or
        #: when it is collected.
        self._pool = ConnectionPool()
        weakref.finalize(self, self._pool.close)

    def close(self) -> None:
        """Close the session's idle connections (the execution ended). Fetching afterwards still works,
        on connections that are closed after their response."""
        self._pool.close()

    @property
    def records(self) -> list[EgressRecord]:
        with self._lock:
            done = self._records
            for index in range(self._built, len(done)):  # each draft becomes a record once, on first read
                draft = done[index]
                if isinstance(draft, _Draft):
                    done[index] = _record(draft)
            self._built = len(done)
            return list(done)  # type: ignore[arg-type]  # every entry is an EgressRecord now

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    # ------------------------------------------------------------------------------------ entry points

    def handle(self, frame: bytes | str) -> bytes:
        """The wire entry point: a `FetchRequest` as JSON in, a `FetchReply` as JSON out. Never raises
        for anything the program sends."""
        served = self._serve(frame)
        if isinstance(served, FetchReply):
            return served.model_dump_json().encode()
        response, body = served
        response = response.model_copy(update={"body_b64": base64.b64encode(body).decode("ascii")})
        return FetchReply.model_construct(response=response, error=None).model_dump_json().encode()

    def handle_parts(self, frame: bytes | str) -> tuple[bytes, bytes | None]:
        """`handle` with a response's body kept apart: a `FetchReply` whose ``body_b64`` is empty and the
        body's bytes (None for an error reply). The sandbox's exchange sends the body as a raw frame, so a
        large body is never base64-encoded nor escaped inside JSON. Never raises."""
        served = self._serve(frame)
        if isinstance(served, FetchReply):
            return served.model_dump_json().encode(), None
        response, body = served
        return FetchReply.model_construct(response=response, error=None).model_dump_json().encode(), body

    def handle_request(
        self, request: Mapping[str, Any], *, piped: bool = False
    ) -> tuple[dict[str, Any], bytes | PipedBody | None]:
        """`handle_parts` for a request its caller already parsed (the sandbox's exchange decoded the
        program's frame once): the same checks on the same fields, and the `FetchReply` as a JSON-ready
        mapping (``body_b64`` empty) with the body apart. Nothing is encoded to JSON and parsed again on
        the way. Never raises.

        ``piped``: the caller forwards the body without looking into it (the exchange), so a large plain
        body with a declared length may come as a `PipedBody` (spliced from the server's socket into a
        pipe, never copied into this process: ``transport.stage``); never when the policy injects a
        credential (the body is then searched for it)."""
        asked = self._request(request)
        if isinstance(asked, FetchReply):
            return asked.model_dump(), None
        try:
            fields, body = self._fetch_plain(asked, piped=piped)
        except FetchError as exc:
            return self._failed(exc).model_dump(), None
        return {"response": fields, "error": None}, body

    def _serve(self, frame: bytes | str) -> FetchReply | tuple[FetchResponse, bytes]:
        """An error reply, or the response and its body."""
        request = self._request(frame)
        if isinstance(request, FetchReply):
            return request
        try:
            return self.fetch_parts(request)
        except FetchError as exc:
            return self._failed(exc)

    @staticmethod
    def _request(frame: bytes | str | Mapping[str, Any]) -> FetchRequest | FetchReply:
        """The program's request, or the reply refusing it as malformed."""
        try:
            if isinstance(frame, Mapping):
                return FetchRequest.model_validate(frame)
            return FetchRequest.model_validate_json(frame)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            failure = FetchFailure(
                kind="invalid_fetch", message=f"malformed fetch request: {where}: {first['msg']}"[:4096], reason="wire"
            )
            return FetchReply(error=failure)

    def _failed(self, exc: FetchError) -> FetchReply:
        failure = FetchFailure(kind=exc.kind, message=self._redact(str(exc))[:4096], reason=exc.reason[:100])
        return FetchReply(error=failure)

    def fetch(self, request: FetchRequest) -> FetchResponse:
        """Perform `request` under the policy; raises a `FetchError` subclass on every failure."""
        response, body = self.fetch_parts(request)
        return response.model_copy(update={"body_b64": base64.b64encode(body).decode("ascii")})

    def fetch_parts(self, request: FetchRequest) -> tuple[FetchResponse, bytes]:
        """`fetch` with the body apart: the response (``body_b64`` empty) and the body's bytes."""
        fields, body = self._fetch_plain(request)
        assert isinstance(body, bytes)  # only a `piped` caller gets a pipe
        return FetchResponse.model_construct(**fields), body  # every field built by `_fetch`

    def _fetch_plain(self, request: FetchRequest, *, piped: bool = False) -> tuple[dict[str, Any], bytes | PipedBody]:
        """`fetch_parts` with the response's fields as a plain mapping (a `FetchResponse`'s, ``body_b64``
        empty): what the sandbox's exchange sends on, with no model built and dumped again per request."""
        start = time.monotonic()
        method = request.method.upper()
        record = _Draft(method=method[:16], url="")
        try:
            return self._fetch(request, method, record, start, piped=piped and not self._broker._injects)
        except FetchError as exc:
            record.error = exc.kind
            record.denied = self._redact(str(exc))
            if exc.message:
                exc.message = self._redact(exc.message)
                exc.args = (exc.message,)
            raise
        finally:
            record.duration_ms = round((time.monotonic() - start) * 1000, 3)
            record.url = self._redact(record.url or _scrub(request.url))  # not parsed: the text, scrubbed
            if self._secrets:
                record.final_url = self._redact(record.final_url) if record.final_url else None
                record.redirects = [self._redact(url) for url in record.redirects]
            with self._lock:
                self._records.append(record)  # an `EgressRecord` once read (`records`): none is built per request
            if logger.isEnabledFor(logging.INFO):
                logger.info("egress %s", json.dumps(_record(record).model_dump(mode="json"), separators=(",", ":")))

    # ------------------------------------------------------------------------------------------ steps

    def _fetch(
        self, request: FetchRequest, method: str, record: _Draft, start: float, *, piped: bool = False
    ) -> tuple[dict[str, Any], bytes | PipedBody]:
        limits = self._broker.policy.limits
        with self._lock:
            if self._requests >= limits.max_requests:
                raise EgressLimit(
                    f"this execution already made {self._requests} requests (egress.limits.max_requests)",
                    reason="max_requests",
                )
            self._requests += 1
        if method not in METHODS:
            raise InvalidFetch(f"method {request.method[:20]!r} is not supported ({', '.join(sorted(METHODS))})")
        body = request.body()
        if body is not None and len(body) > limits.max_request_bytes:
            raise EgressLimit(
                f"request body of {len(body)} bytes is larger than egress.limits.max_request_bytes "
                f"({limits.max_request_bytes})",
                reason="request_size",
            )
        headers = self._program_headers(request.headers)
        target = parse_url(request.url, request.params)
        record.url = target.url
        timeout = min(request.timeout_s or limits.timeout_s, limits.timeout_s)
        deadline = start + timeout
        if self._deadline is not None:
            if self._deadline <= start:
                raise EgressLimit("the execution's time budget is spent", reason="time_budget")
            deadline = min(deadline, self._deadline)
        origin = target.origin
        hops = 0
        while True:
            record.rule = self._broker._admit(target, method)
            verdicts = self._broker._addresses(target, deadline)
            sent = self._hop_headers(target, headers, keep_origin_bound=target.origin == origin, body=body)
            cap, cap_what = self._cap(limits.max_response_bytes)
            outgoing = Outgoing(
                target=target, method=method, headers=sent, body=body, deadline=deadline, cap=cap, cap_what=cap_what,
                piped=piped,
            )  # fmt: skip
            raw = exchange(outgoing, verdicts, self._broker._ssl, self._pool)
            location = next((v for k, v in raw.headers if k.lower() == "location"), None)
            if raw.status in REDIRECTS and location is not None:
                _drop(raw.body)  # a redirect's body is not kept (its size still counts)
                hops += 1
                if hops > limits.max_redirects:
                    raise EgressLimit(
                        f"more than {limits.max_redirects} redirects (egress.limits.max_redirects), last to "
                        f"{_scrub(location)}",
                        reason="max_redirects",
                    )
                self._count(len(raw.body), limits.max_total_bytes)
                target = join(target, location)
                record.redirects.append(target.url)
                if raw.status == 303 or (raw.status in (301, 302) and method == "POST"):
                    method = "GET" if method != "HEAD" else "HEAD"
                    body = None
                continue
            self._count_kept(raw.body, limits.max_total_bytes)
            record.final_url = target.url
            record.status = raw.status
            record.bytes = len(raw.body)
            response = {  # a `FetchResponse`'s fields, every one; the body travels apart
                "status": raw.status,
                "headers": self._response_headers(raw.headers, decoded=bool(raw.body) or raw.wire_bytes > 0),
                "url": self._redact(target.url),
                "body_b64": "",
                "elapsed_ms": round((time.monotonic() - start) * 1000, 3),
            }
            return response, self._kept(raw.body)

    def _cap(self, max_response: int) -> tuple[int, str]:
        with self._lock:
            left = self._broker.policy.limits.max_total_bytes - self._total_bytes
        if left < max_response:
            return max(0, left), "what is left of egress.limits.max_total_bytes"
        return max_response, "egress.limits.max_response_bytes"

    def _kept(self, body: bytes | PipedBody) -> bytes | PipedBody:
        """The body the program gets: a piped one as it is (only piped when no credential is injected:
        nothing to redact), bytes with every injected secret redacted."""
        return body if isinstance(body, PipedBody) else self._redact_bytes(body)

    def _count_kept(self, body: bytes | PipedBody, max_total: int) -> None:
        """`_count` for the body the program gets (a piped one is closed when it is over the budget)."""
        try:
            self._count(len(body), max_total)
        except EgressLimit:
            if isinstance(body, PipedBody):
                body.close()
            raise

    def _count(self, size: int, max_total: int) -> None:
        with self._lock:
            self._total_bytes += size
            if self._total_bytes > max_total:
                raise EgressLimit(
                    f"this execution received more than {max_total} bytes (egress.limits.max_total_bytes)",
                    reason="max_total_bytes",
                )

    @staticmethod
    def _program_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
        seen: set[str] = set()
        out: list[tuple[str, str]] = []
        for name, value in headers.items():
            lower = name.lower()
            if not _TOKEN.fullmatch(name):
                raise EgressDenied(f"header name {name[:60]!r} is not a token", reason="header_injection")
            if any(ch in value for ch in "\r\n\0") or any(ord(ch) < 0x20 and ch != "\t" for ch in value):
                raise EgressDenied(f"header {name!r} has CR, LF or control characters", reason="header_injection")
            if lower in FORBIDDEN_HEADERS or lower.startswith("proxy-"):
                raise EgressDenied(f"header {name!r} is set by the broker, not the program", reason="forbidden_header")
            if lower in seen:
                raise InvalidFetch(f"header {name!r} given twice", reason="duplicate_header")
            seen.add(lower)
            if lower in OWNED_HEADERS:
                continue
            try:
                value.encode("latin-1")
            except UnicodeEncodeError:
                raise InvalidFetch(f"header {name!r} is not Latin-1 text", reason="header_encoding") from None
            out.append((name, value))
        return out

    def _hop_headers(
        self, target: Target, headers: list[tuple[str, str]], *, keep_origin_bound: bool, body: bytes | None
    ) -> list[tuple[str, str]]:
        injected = self._broker._credentials.for_target(target) if self._broker._injects else []
        if injected:
            with self._lock:
                self._secrets.update(secret for item in injected for secret in item.secrets)
        replaced = {item.header.lower() for item in injected}
        sent = [("Host", target.authority)]
        for name, value in headers:
            lower = name.lower()
            if lower in replaced or (lower in ORIGIN_BOUND_HEADERS and not keep_origin_bound):
                continue
            sent.append((name, value))
        names = {name.lower() for name, _ in sent}
        if "user-agent" not in names:
            sent.append(("User-Agent", USER_AGENT))
        if "accept" not in names:
            sent.append(("Accept", "*/*"))
        sent.append(("Accept-Encoding", "gzip, deflate"))
        if body is not None:
            sent.append(("Content-Length", str(len(body))))
        sent.extend((item.header, item.value) for item in injected)
        return sent

    def _response_headers(self, headers: list[tuple[str, str]], *, decoded: bool) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in headers:
            lower = name.lower()
            if lower in ("content-encoding", "content-length", "transfer-encoding") and decoded:
                if lower == "content-encoding" and value.strip().lower() not in ("gzip", "x-gzip", "deflate"):
                    pass  # not decoded by the broker: keep it, so the program knows
                else:
                    continue
            value = self._redact(value)
            out[lower] = f"{out[lower]}, {value}" if lower in out else value
        return out

    # ------------------------------------------------------------------------------------- redaction

    def _redact(self, text: str) -> str:
        if not self._secrets:  # nothing injected yet (most executions): no lock, no sort, per header value
            return text
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            if secret:
                text = text.replace(secret, REDACTED)
        return text

    def _redact_bytes(self, data: bytes) -> bytes:
        if not self._secrets:
            return data
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            encoded = secret.encode("utf-8", "replace")
            if encoded and encoded in data:
                data = data.replace(encoded, REDACTED.encode())
        return data


def dump_records(records: Sequence[EgressRecord]) -> list[dict[str, Any]]:
    """Records as JSON values, for outcome metadata and the call log."""
    return [record.model_dump(mode="json") for record in records]
