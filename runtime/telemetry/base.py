"""What both sides of the telemetry seam share: the no-op span and telemetry, the metric table.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

#: An attribute value as OpenTelemetry takes it; None values are dropped (OpenTelemetry refuses them).
AttrValue = str | bool | int | float | Sequence[str] | None
Attributes = Mapping[str, AttrValue]
SpanKind = Literal["internal", "client"]

#: Every metric sandforge records: name -> (instrument, unit, description). They mirror the call log.
METRICS: dict[str, tuple[Literal["counter", "histogram"], str, str]] = {
    "sandforge.calls": ("counter", "{call}", "Dynamic calls (nested ones too), by role, method, status, source"),
    "sandforge.call.failures": ("counter", "{call}", "Failed calls by error type and failure class"),
    "sandforge.execs": ("counter", "{program}", "Programs run without a model (exec, POST /v1/exec, MCP exec)"),
    "sandforge.attempt.failures": ("counter", "{attempt}", "Failed attempts by stage, error class, failure class"),
    "sandforge.execution.duration": ("histogram", "s", "Sandbox execution time of one attempt"),
    "sandforge.sandbox.acquisitions": ("counter", "{sandbox}", "Sandboxes handed out: warm pool hits and cold starts"),
    "sandforge.security_events": ("counter", "{event}", "Executions ended by a security event, by source and event"),
    "sandforge.egress.requests": ("counter", "{request}", "Requests programs asked the host to make"),
    "sandforge.egress.denials": ("counter", "{request}", "Requests refused by the egress policy"),
    "gen_ai.client.operation.duration": ("histogram", "s", "Program generation by the model provider"),
}


class SpanHandle:
    """A span as the instrumented code sees it. This one records nothing (the OpenTelemetry one does)."""

    __slots__ = ()

    def __enter__(self) -> SpanHandle:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def set(self, attributes: Attributes) -> None:
        """Add attributes (None values are left out)."""

    def event(self, name: str, attributes: Attributes) -> None:
        """A point in time inside the span (a failed attempt)."""

    def fail(self, error_type: str, message: str | None) -> None:
        """Mark the span failed: status ERROR, ``error.type``."""


NULL_SPAN = SpanHandle()


class Telemetry:
    """The instrumentation every hook goes through. This base records nothing: ``enabled`` is False, and hooks
    that would build attributes check it first."""

    enabled = False
    record_io = False

    def span(self, name: str, attributes: Attributes | None = None, kind: SpanKind = "internal") -> SpanHandle:
        """A span to use as a context manager: a child of the current one, current inside the ``with``."""
        return NULL_SPAN

    def span_between(self, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
        """A finished child span of the current one, from ``start_ns`` to ``end_ns`` (``time.time_ns``)."""

    def add(self, metric: str, value: int, attributes: Attributes | None = None) -> None:
        """Add to the counter ``metric`` (a name of :data:`METRICS`)."""

    def record(self, metric: str, value: float, attributes: Attributes | None = None) -> None:
        """Record a value in the histogram ``metric`` (a name of :data:`METRICS`)."""

    def flush(self) -> None:
        """Export what is buffered (the command line calls it before exiting)."""


NULL = Telemetry()


def clean(attributes: Attributes | None) -> dict[str, Any]:
    """Attributes without None values (OpenTelemetry drops them with a warning)."""
    if not attributes:
        return {}
    return {k: v for k, v in attributes.items() if v is not None}
