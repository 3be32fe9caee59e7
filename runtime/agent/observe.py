"""What one call tells OpenTelemetry (issue 21): its spans, events and metrics, named after the GenAI semantic
conventions where they have a name (``execute_tool {gen_ai.tool.name}``, ``chat {model}``).

The lifecycle calls these hooks; they go through ``runtime.telemetry`` (which alone imports OpenTelemetry) and
return at once when telemetry is off. Programs' arguments and results are recorded only when
``SANDFORGE_OTEL_RECORD_IO=1``; program code, credentials and fetched URLs' paths and queries never are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from sandforge.runtime.guardrails import ValidationResult
from sandforge.runtime.telemetry import NULL_SPAN, SpanHandle, Telemetry, current
from sandforge.sandbox import BridgeHandler, ExecutionOutcome
from sandforge.sandbox.exchange import Reply
from sandforge.sandbox.protocol import CallFrame, SecurityEvent

if TYPE_CHECKING:  # annotations only: `sandforge exec` runs a program without a call's spec, outcome or log
    from sandforge.runtime.agent.env import CallSpec
    from sandforge.runtime.agent.outcome import Outcome
    from sandforge.runtime.environments.records import PreparedEnvironment

T = TypeVar("T")

#: Free text in attributes (error messages, recorded arguments) is cut to this many characters.
MAX_TEXT = 1000


def _text(value: object, limit: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 14] + "...[truncated]"


def tool_name(role: str, method: str) -> str:
    return f"{role}.{method}"


def call_span(tel: Telemetry, spec: CallSpec) -> SpanHandle:
    """The span of one dynamic call (nested calls are children of their parent's execution span)."""
    if not tel.enabled:
        return NULL_SPAN
    name = tool_name(spec.role, spec.method)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": spec.call_id,
        "gen_ai.tool.type": "function",
        "sandforge.role": spec.role,
        "sandforge.method": spec.method,
        "sandforge.trace_id": spec.trace_id,
        "sandforge.depth": spec.depth,
        "sandforge.parent_call_id": spec.parent_call_id,
    }
    if tel.record_io:
        attributes["gen_ai.tool.call.arguments"] = _text({"args": spec.args, "kwargs": spec.kwargs})
    return tel.span(f"execute_tool {name}", attributes)


def call_ended(tel: Telemetry, span: SpanHandle, spec: CallSpec, outcome: Outcome) -> None:
    """The call's outcome on its span (with one event per failed attempt) and in the call metrics."""
    if not tel.enabled:
        return
    metadata, status = outcome.metadata, outcome.status
    source = metadata.get("program_source")
    failure_class = metadata.get("failure_class") if status != "ok" else None
    span.set({
        "sandforge.status": status,
        "sandforge.program_source": source,
        "sandforge.artifact_hit": source == "persisted",
        "sandforge.attempts": metadata.get("attempts"),
        "sandforge.provider_calls": metadata.get("provider_calls"),
        "sandforge.rollback_applied": metadata.get("rollback_applied"),
        "sandforge.failure_class": failure_class,
        "sandforge.backend": metadata.get("backend"),
    })  # fmt: skip
    if tel.record_io and status == "ok":
        span.set({"gen_ai.tool.call.result": _text(outcome.value)})
    if events := metadata.get("security_events"):  # each is also an event on its execution's span
        span.set({"sandforge.security_events": len(events)})
    for failure in metadata.get("attempt_failures") or []:
        attempt_failed(tel, span, failure)
    if status != "ok":
        span.fail(outcome.error_type or "error", _text(outcome.error_message))
    common = {"sandforge.role": spec.role, "sandforge.method": spec.method}
    tel.add("sandforge.calls", 1, {**common, "sandforge.status": status, "sandforge.program_source": source})
    if status != "ok":
        failed = {**common, "error.type": outcome.error_type, "sandforge.failure_class": failure_class}
        tel.add("sandforge.call.failures", 1, failed)


def attempt_failed(tel: Telemetry, span: SpanHandle, failure: Mapping[str, Any]) -> None:
    """One failed attempt: a span event (what the call log's ``attempt_failures`` entry says) and a count."""
    attributes = {
        "sandforge.attempt.number": failure.get("attempt_number"),
        "sandforge.failure.stage": failure.get("stage"),
        "sandforge.failure.error_class": failure.get("error_class"),
        "error.type": failure.get("error_type") or failure.get("error_class"),
        "sandforge.failure_class": failure.get("failure_class"),
        "sandforge.program_source": failure.get("program_source"),
        "sandforge.failure.message": _text(failure.get("error_message")),
    }
    if isinstance(event := failure.get("security_event"), Mapping):
        attributes["sandforge.security_event.source"] = event.get("source")
        attributes["sandforge.security_event.event"] = event.get("event")
    span.event("sandforge.attempt.failed", attributes)
    tel.add("sandforge.attempt.failures", 1, {k: attributes[k] for k in (
        "sandforge.failure.stage", "sandforge.failure.error_class", "sandforge.failure_class")})  # fmt: skip


class _Generation(SpanHandle):
    """The span of one generation and its duration metric (telemetry on)."""

    __slots__ = ("_attributes", "_span", "_started", "_tel")

    def __init__(self, tel: Telemetry, attributes: dict[str, Any], name: str) -> None:
        self._tel, self._attributes = tel, attributes
        self._span = tel.span(name, attributes, kind="client")
        self._started = 0.0

    def __enter__(self) -> SpanHandle:
        self._started = time.monotonic()
        return self._span.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._span.__exit__(kind, exc, tb)
        error = kind.__qualname__ if kind is not None else None
        self._tel.record("gen_ai.client.operation.duration", time.monotonic() - self._started,
                         {**self._attributes, "error.type": error})  # fmt: skip


def generation(tel: Telemetry, provider: str, model: str | None) -> SpanHandle:
    """A generation (or repair) by the model provider: ``chat {model}``, and its duration metric."""
    if not tel.enabled:
        return NULL_SPAN
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model}
    return _Generation(tel, attributes, f"chat {model}" if model else "chat")


def generated(span: SpanHandle, *, model: str | None, input_tokens: int | None, output_tokens: int | None,
              repair: bool) -> None:  # fmt: skip
    span.set({"gen_ai.response.model": model, "gen_ai.usage.input_tokens": input_tokens,
              "gen_ai.usage.output_tokens": output_tokens, "sandforge.repair": repair})  # fmt: skip


def stage(tel: Telemetry, name: str, attributes: Mapping[str, Any] | None = None) -> SpanHandle:
    """A step of an attempt: ``sandforge.validate``, ``sandforge.execute``, ``sandforge.commit``."""
    if not tel.enabled:
        return NULL_SPAN
    return tel.span(f"sandforge.{name}", attributes)


def validated(span: SpanHandle, result: ValidationResult) -> None:
    tags = sorted({c.tag for c in result.capabilities})
    span.set({"sandforge.verdict": result.verdict, "sandforge.capabilities": tags,
              "sandforge.violations": len(result.violations),
              "sandforge.policy_fingerprint": result.policy_fingerprint})  # fmt: skip


def executed(tel: Telemetry, span: SpanHandle, outcome: ExecutionOutcome, *, started_ns: int) -> None:
    """An execution's result on its span (and its security event, if it ended on one), its sandbox
    acquisition as a child span, and the execution metrics."""
    if not tel.enabled:
        return
    backend, ok, duration_s, metadata = outcome.backend, outcome.ok, outcome.duration_s, outcome.metadata
    error_type = outcome.error_type.value if outcome.error_type else None
    if outcome.security_event is not None:
        security_event_seen(tel, span, outcome.security_event, backend)
    start = metadata.get("sandbox_start")
    acquire_s = metadata.get("sandbox_acquire_s")
    if isinstance(acquire_s, (int, float)):
        tel.span_between("sandforge.sandbox.acquire", started_ns, started_ns + int(acquire_s * 1e9),
                         {"sandforge.backend": backend, "sandforge.sandbox.start": start})  # fmt: skip
    if start in ("warm", "cold"):
        tel.add("sandforge.sandbox.acquisitions", 1, {"sandforge.backend": backend, "sandforge.sandbox.start": start})
    span.set({"sandforge.backend": backend, "sandforge.sandbox.start": start, "sandforge.ok": ok,
              "sandforge.execution.duration_s": duration_s})  # fmt: skip
    if not ok:
        span.fail(error_type or "error", None)
    tel.record(
        "sandforge.execution.duration",
        duration_s,
        {"sandforge.backend": backend, "sandforge.status": "ok" if ok else "error", "error.type": error_type},
    )


def security_attributes(event: SecurityEvent) -> dict[str, str]:
    """What telemetry says of a security event: its source and name, never its detail (which may quote a name
    the program chose; the call log and the dashboard keep it)."""
    return {"sandforge.security_event.source": event.source, "sandforge.security_event.event": event.event}


def security_event_seen(tel: Telemetry, span: SpanHandle, event: SecurityEvent, backend: str) -> None:
    """An execution that ended on a security event (docs/security.md, "The tripwire"): a span event and
    attributes on the execution's span, and a count."""
    attributes = security_attributes(event)
    span.event("sandforge.security_event", attributes)
    span.set(attributes)
    tel.add("sandforge.security_events", 1, {**attributes, "sandforge.backend": backend})


def egress_span(tel: Telemetry) -> SpanHandle:
    """A request a program asked the host to make (attributes set by :func:`egress_ended` once decided)."""
    if not tel.enabled:
        return NULL_SPAN
    return tel.span("sandforge.egress", None, kind="client")


def egress_ended(tel: Telemetry, span: SpanHandle, record: Mapping[str, Any] | None) -> None:
    """What the broker did: method, host and port (never the path, query or credentials), status, decision."""
    if not tel.enabled or record is None:
        return
    from urllib.parse import urlsplit

    method = str(record.get("method") or "GET")
    try:
        parts = urlsplit(str(record.get("url") or ""))
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    error = record.get("error")
    denied = error == "egress_denied"
    decision = "denied" if denied else "failed" if error else "allowed"
    span.set({"http.request.method": method, "server.address": host, "server.port": port,
              "http.response.status_code": record.get("status"), "sandforge.egress.decision": decision,
              "sandforge.egress.rule": record.get("rule"), "sandforge.egress.bytes": record.get("bytes")})  # fmt: skip
    if error:
        span.fail(str(error), None)
    tel.add("sandforge.egress.requests", 1, {"http.request.method": method, "sandforge.egress.decision": decision})
    if denied:
        tel.add("sandforge.egress.denials", 1, {"http.request.method": method})


# --- one program without a model (``sandforge exec``, ``POST /v1/exec``, MCP ``exec``) -----------------------


def exec_span(tel: Telemetry, backend: str | None) -> SpanHandle:
    """The span of one program run by ``execute_program``; its stages are children, as an attempt's are."""
    if not tel.enabled:
        return NULL_SPAN
    return tel.span("sandforge.exec", {"sandforge.backend": backend})


def exec_ended(tel: Telemetry, span: SpanHandle, outcome: ExecutionOutcome, result: ValidationResult | None) -> None:
    """The run's outcome on its span and in ``sandforge.execs`` (the error type only: a program's message may
    carry anything it read)."""
    if not tel.enabled:
        return
    error = outcome.error_type.value if outcome.error_type else None
    span.set({"sandforge.status": "ok" if outcome.ok else "error", "sandforge.backend": outcome.backend,
              "sandforge.verdict": result.verdict if result else None,
              "sandforge.environment.id": outcome.metadata.get("env_id")})  # fmt: skip
    if tel.record_io and outcome.ok:
        span.set({"sandforge.exec.result": _text(outcome.value)})
    if outcome.security_event is not None:
        span.set(security_attributes(outcome.security_event))
    if not outcome.ok:
        span.fail(error or "error", None)
    tel.add("sandforge.execs", 1, {"sandforge.status": "ok" if outcome.ok else "error", "error.type": error})


def environment_prepared(span: SpanHandle, prepared: PreparedEnvironment | None) -> None:
    """The environment a program declared: its id and whether it was cached (a failure: the span's error)."""
    if prepared is None:
        span.fail("environment_failed", None)
        return
    span.set({"sandforge.environment.id": prepared.env_id, "sandforge.environment.cache_hit": prepared.cache_hit,
              "sandforge.environment.prepare_ms": round(prepared.prepare_ms, 3)})  # fmt: skip


class _TracedBridge:
    """A bridge whose fetches are client spans (an agent's ``AttemptBridge`` traces its own)."""

    def __init__(self, inner: BridgeHandler) -> None:
        self.inner = inner

    def __call__(self, frame: CallFrame) -> Reply:
        return self.inner(frame)


def traced_bridge(tel: Telemetry, bridge: BridgeHandler | None) -> BridgeHandler | None:
    """``bridge`` with each egress entry point it has wrapped in a ``sandforge.egress`` span, decided from the
    record its ``fetches`` keep (the exchange picks the entry point by presence: the same ones are present)."""
    if bridge is None or not tel.enabled:
        return bridge
    fetches = getattr(bridge, "fetches", None)
    traced = _TracedBridge(bridge)
    for name in ("declare", "egress", "egress_parts", "egress_request"):
        method = getattr(bridge, name, None)
        if method is not None:
            setattr(traced, name, method if name == "declare" else _egress_traced(tel, method, fetches))
    return traced


def _egress_traced(tel: Telemetry, method: Callable[..., T], fetches: Any) -> Callable[..., T]:
    def fetch(*args: Any) -> T:
        records = getattr(fetches, "records", None)
        before = len(records) if records is not None else 0
        with egress_span(tel) as span:
            answer = method(*args)
            records = getattr(fetches, "records", None)
            last = records[-1] if records is not None and len(records) > before else None
            egress_ended(tel, span, last.model_dump(mode="json") if last is not None else None)
        return answer

    return fetch


def telemetry() -> Telemetry:
    return current()
