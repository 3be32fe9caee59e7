"""The agent's side of brokered egress (issue 18): which broker a policy gets, and one execution's session.

Every path that runs a program under a policy (the agent's calls, nested calls, sessions through the
agent, ``sandforge exec``) answers the program's fetch frames with :class:`ExecutionEgress`: one per
execution, holding the ``EgressSession`` of the policy's broker (made on the first fetch, with the
execution's deadline, so the time spent fetching counts against the execution's timeout). A policy that
does not grant ``http_fetch`` gets no broker: every fetch is denied, naming the missing grant, and nothing
is sent anywhere. :func:`broker_for` compiles one broker per compiled policy and keeps it while the policy
lives; the broker is immutable and thread-safe, sessions never share a lock.

The records of the session are the execution's provenance: the host writes them into the outcome's
metadata (``egress``) and the call log, so the sources of fetched data never depend on the model.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.guardrails import Policy
from sandforge.sandbox import BridgeReply, ErrorType, ExecutionOutcome
from sandforge.sandbox.channel import PipedBody
from sandforge.sandbox.exchange import no_bridge
from sandforge.sandbox.protocol import CallFrame

if TYPE_CHECKING:  # the broker (its HTTP client, TLS, thread pools) and the fetch frames' models (``egress.wire``)
    # load on the first fetch, not with the agent or ``sandforge exec``
    from sandforge.runtime.egress.broker import EgressBroker, EgressRecord, EgressSession

log = logging.getLogger(__name__)

#: The capability a policy grants for brokered requests.
HTTP_FETCH = "http_fetch"
#: The denial of every fetch of an execution whose policy does not grant it (the same words as the
#: sandbox's answer for a bridge without egress).
NO_GRANT = "this execution has no egress: grant http_fetch and list egress.allow entries in the policy"
#: The outcome error types a fetch can end an execution with, when the program does not catch it.
EGRESS_ERRORS: frozenset[ErrorType] = frozenset(
    {
        ErrorType.EGRESS_DENIED,
        ErrorType.EGRESS_LIMIT,
        ErrorType.NETWORK_ERROR,
        ErrorType.MISSING_CREDENTIALS,
        ErrorType.INVALID_FETCH,
    }
)

#: Nested calls whose fetches an outcome lists (each with its own records; the call log has every one).
MAX_NESTED_SOURCES = 100

_lock = threading.Lock()
#: id(policy) -> (the policy, weakly; its broker or why it has none). An entry goes when its policy does.
_brokers: dict[int, tuple[weakref.ref[Policy], EgressBroker | str]] = {}


def broker_for(policy: Policy) -> EgressBroker | str:
    """The broker of ``policy`` (one per compiled policy), or why its executions cannot fetch at all."""
    if HTTP_FETCH not in policy.granted:
        return NO_GRANT
    key = id(policy)
    with _lock:
        held = _brokers.get(key)
        if held is not None and held[0]() is policy:
            return held[1]
    from sandforge.runtime.egress.broker import EgressBroker

    try:
        made: EgressBroker | str = EgressBroker(policy.egress)
    except SandforgeError as exc:  # an unreadable egress.ca_file: the deployment's to fix, fail closed
        made = f"the policy's egress section cannot be used: {exc}"
    with _lock:
        held = _brokers.get(key)
        if held is not None and held[0]() is policy:
            return held[1]
        _brokers[key] = (weakref.ref(policy, functools.partial(_forget, key)), made)
    return made


def _forget(key: int, _gone: object) -> None:
    with _lock:
        held = _brokers.get(key)
        if held is not None and held[0]() is None:
            del _brokers[key]


def _failure(kind: str, message: str, reason: str) -> dict[str, Any]:
    from sandforge.runtime.egress.wire import FetchFailure, FetchReply

    failure = FetchFailure.model_validate({"kind": kind, "message": message[:4096], "reason": reason[:100]})
    return FetchReply(error=failure).model_dump()


def _json(reply: Mapping[str, Any]) -> bytes:
    from sandforge.runtime.egress.wire import FetchReply

    return FetchReply.model_validate(reply).model_dump_json().encode()


class ExecutionEgress:
    """One execution's fetches: its session (made on the first one) and the kinds of error it replied.

    ``egress`` never raises: whatever the program sends, it answers a ``FetchReply`` as JSON bytes."""

    def __init__(self, broker: EgressBroker | str, *, deadline: float | None = None) -> None:
        self._broker = broker
        self._deadline = deadline  # the execution's, when known before it starts (a nested call's parent's)
        self._lock = threading.Lock()
        self._session: EgressSession | None = None
        self._refused: list[EgressRecord] = []  # denials made without a broker
        self._replied: set[str] = set()
        self._nested: list[dict[str, Any]] = []  # what the program's nested calls fetched, theirs included

    def egress(self, request: bytes, deadline: float) -> bytes:
        """Answer one ``FetchRequest`` (JSON) of the running program; ``deadline`` is the execution's."""
        return self.egress_parts(request, deadline, raw_body=False)[0]

    def egress_parts(self, request: bytes, deadline: float, *, raw_body: bool = True) -> tuple[bytes, bytes | None]:
        """:meth:`egress` with a response's body apart (raw bytes, no base64: ``EgressSession.handle_parts``)."""
        body: bytes | None = None
        try:
            if isinstance(self._broker, str):
                reply = _json(self._refuse(request, self._broker, "egress_denied"))
            elif raw_body:
                reply, body = self._session_for(deadline, self._broker).handle_parts(request)
            else:
                reply = self._session_for(deadline, self._broker).handle(request)
        except Exception:  # a broker bug: the program gets a typed failure, the exchange goes on
            log.exception("the egress broker failed")
            reply, body = _json(self._refuse(request, "the host failed to broker the request", "network_error")), None
        self._note(reply)
        return reply, body

    def egress_request(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[dict[str, Any], bytes | PipedBody | None]:
        """:meth:`egress_parts` for a request the exchange already parsed (the program's frame is decoded
        once): the ``FetchReply`` as a mapping, the body apart (``EgressSession.handle_request``; a large
        plain body as a pipe the exchange splices into the sandbox's channel)."""
        body: bytes | PipedBody | None = None
        try:
            if isinstance(self._broker, str):
                reply = self._refuse(request, self._broker, "egress_denied")
            else:
                reply, body = self._session_for(deadline, self._broker).handle_request(request, piped=True)
        except Exception:  # a broker bug: the program gets a typed failure, the exchange goes on
            log.exception("the egress broker failed")
            reply, body = self._refuse(request, "the host failed to broker the request", "network_error"), None
        error = reply.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("kind"), str):
            with self._lock:
                self._replied.add(error["kind"])
        return reply, body

    def _session_for(self, deadline: float, broker: EgressBroker) -> EgressSession:
        with self._lock:
            if self._session is None:
                limit = deadline if self._deadline is None else min(deadline, self._deadline)
                self._session = broker.session(deadline=limit)
            return self._session

    def _refuse(self, request: bytes | Mapping[str, Any], why: str, kind: str) -> dict[str, Any]:
        from sandforge.runtime.egress.broker import EgressRecord
        from sandforge.runtime.egress.wire import FetchRequest

        try:
            if isinstance(request, Mapping):
                asked = FetchRequest.model_validate(request)
            else:
                asked = FetchRequest.model_validate_json(request)
        except ValidationError:
            return _failure("invalid_fetch", "malformed fetch request", "wire")
        method, url = asked.method.upper()[:16], _scrub(asked.url)
        record = EgressRecord(method=method, url=url, denied=why, error=kind)
        with self._lock:
            self._refused.append(record)
        reason = "internal" if kind != "egress_denied" else "not_granted" if why == NO_GRANT else "policy"
        return _failure(kind, why, reason)

    def _note(self, reply: bytes) -> None:
        if reply.endswith(b'"error":null}'):  # a response (its body never holds a quote): nothing to note
            return
        from sandforge.runtime.egress.wire import FetchReply

        try:
            answer = FetchReply.model_validate_json(reply)
        except ValidationError:  # the broker always answers a valid reply; never trust a kind we cannot read
            return
        if answer.error is not None:
            with self._lock:
                self._replied.add(answer.error.kind)

    @property
    def records(self) -> list[EgressRecord]:
        """Every request of this execution: what the broker did, or why it was refused (the refusals made
        here, without a broker or after a broker failure, come first)."""
        with self._lock:
            session, refused = self._session, list(self._refused)
        return refused + (session.records if session is not None else [])

    def replied(self, kind: str) -> bool:
        """Whether a fetch of this execution was answered with an error of ``kind``."""
        with self._lock:
            return kind in self._replied

    def nested(self, call: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        """A nested call of this execution ended: keep what it (and its own nested calls) fetched, so the
        data a parent returns from a fetching tool still comes with the host's sources."""
        own = metadata.get("egress")
        entries = [{**call, "egress": own}] if isinstance(own, list) and own else []
        deeper = metadata.get("egress_nested")
        entries += [e for e in deeper if isinstance(e, dict)] if isinstance(deeper, list) else []
        with self._lock:
            self._nested.extend(entries[: max(0, MAX_NESTED_SOURCES - len(self._nested))])

    def close(self) -> None:
        """The execution ended: its session's kept-alive connections are closed."""
        with self._lock:
            session = self._session
        if session is not None:
            session.close()

    def attach(self, outcome: ExecutionOutcome) -> ExecutionOutcome:
        """The outcome with this execution's provenance in ``metadata["egress"]`` (when it fetched), and an
        egress error type the host never replied turned into what it is: the program's own exception. The
        execution is over: its kept-alive connections are closed."""
        self.close()
        records = self.records
        if records:
            outcome.metadata["egress"] = [record.model_dump(mode="json") for record in records]
        with self._lock:
            nested = list(self._nested)
        if nested:
            outcome.metadata["egress_nested"] = nested
        kind = outcome.error_type
        if kind in EGRESS_ERRORS and kind is not None and not self.replied(kind.value):
            log.warning("the program ended with %s, which no fetch of its execution was answered with", kind.value)
            message = f"the program raised {kind.value} itself, but no fetch of this execution failed that way"
            metadata = {**outcome.metadata, "forged_error_type": kind.value}
            metadata.setdefault("exception", kind.value)
            return outcome.model_copy(update={
                "error_type": ErrorType.EXECUTION, "error_message": f"{message}: {outcome.error_message or ''}"[:2000],
                "retriable": False, "metadata": metadata,
            })  # fmt: skip
        return outcome


def _scrub(url: str) -> str:
    """A URL for a refusal record: no userinfo, bounded (it was never parsed: nothing was sent)."""
    scheme, sep, rest = url.partition("://")
    if sep:
        authority, slash, tail = rest.partition("/")
        url = f"{scheme}://{authority.rpartition('@')[2]}{slash}{tail}"
    return url if len(url) <= 500 else url[:500] + "..."


def egress_of(outcome: ExecutionOutcome | None) -> list[dict[str, Any]]:
    """The provenance records an execution outcome carries (none when it did not fetch)."""
    if outcome is None:
        return []
    found = outcome.metadata.get("egress")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


@dataclass
class StandaloneBridge:
    """The bridge of an execution with no agent behind it (``sandforge exec``): its nested calls are
    unavailable, its fetches are brokered under the policy that approved it, like an agent's."""

    fetches: ExecutionEgress

    @classmethod
    def of(cls, policy: Policy) -> StandaloneBridge:
        return cls(ExecutionEgress(broker_for(policy)))

    def __call__(self, frame: CallFrame) -> BridgeReply:
        return no_bridge(frame)

    def egress(self, request: bytes, deadline: float) -> bytes:
        return self.fetches.egress(request, deadline)

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        return self.fetches.egress_parts(request, deadline)

    def egress_request(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[dict[str, Any], bytes | PipedBody | None]:
        return self.fetches.egress_request(request, deadline)
