"""The OpenTelemetry side of the seam: the only module of sandforge that imports ``opentelemetry``.

Imported by ``runtime.telemetry.api`` only when telemetry is wanted. Providers: those an application set
globally (``opentelemetry-instrument``, its own set-up) are used as they are; otherwise the standard
``OTEL_*`` variables set them up here (``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER``: ``otlp``, the
default, ``console`` or ``none``; ``OTEL_EXPORTER_OTLP_*`` for the endpoint; ``OTEL_SERVICE_NAME``, default
``sandforge``) and they become the global ones, so other instrumented libraries join the same traces.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, MeterProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from sandforge.runtime.telemetry.base import METRICS, Attributes, SpanHandle, Telemetry, clean
from sandforge.runtime.telemetry.base import SpanKind as KindName

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

T = TypeVar("T")

log = logging.getLogger(__name__)

SCOPE = "sandforge"
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


class OtelSpan(SpanHandle):
    """A real span, started on ``__enter__`` (and made current), ended on ``__exit__``."""

    __slots__ = ("_attributes", "_kind", "_name", "_span", "_token", "_tracer")

    def __init__(self, tracer: trace.Tracer, name: str, attributes: dict[str, Any], kind: SpanKind) -> None:
        self._tracer, self._name, self._attributes, self._kind = tracer, name, attributes, kind
        self._span: Span = trace.INVALID_SPAN
        self._token: object = None

    def __enter__(self) -> OtelSpan:
        self._span = self._tracer.start_span(self._name, kind=self._kind, attributes=self._attributes)
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            self._span.set_attribute("error.type", type(exc).__qualname__)
        otel_context.detach(self._token)  # type: ignore[arg-type]
        self._span.end()

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(clean(attributes))

    def event(self, name: str, attributes: Attributes) -> None:
        self._span.add_event(name, clean(attributes))

    def fail(self, error_type: str, message: str | None) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR, message or error_type))


class OtelTelemetry(Telemetry):
    """Spans and metrics through OpenTelemetry providers (the global ones when none are given)."""

    enabled = True

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        record_io: bool = False,
    ) -> None:
        self.record_io = record_io
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self.tracer = trace.get_tracer(SCOPE, _version(), tracer_provider)
        meter = metrics.get_meter(SCOPE, _version(), meter_provider)
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        for name, (instrument, unit, description) in METRICS.items():
            if instrument == "counter":
                self._counters[name] = meter.create_counter(name, unit=unit, description=description)
            else:
                self._histograms[name] = meter.create_histogram(name, unit=unit, description=description)

    @classmethod
    def from_environment(cls, *, record_io: bool = False) -> OtelTelemetry:
        """Telemetry on the global providers, set up from the ``OTEL_*`` variables when nothing set them."""
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(_tracer_provider_from_env())
        if type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
            metrics.set_meter_provider(_meter_provider_from_env())
        return cls(record_io=record_io)

    def span(self, name: str, attributes: Attributes | None = None, kind: KindName = "internal") -> SpanHandle:
        return OtelSpan(self.tracer, name, clean(attributes), _KINDS[kind])

    def span_between(self, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
        span = self.tracer.start_span(name, attributes=clean(attributes), start_time=start_ns)
        span.end(end_time=max(end_ns, start_ns))

    def add(self, metric: str, value: int, attributes: Attributes | None = None) -> None:
        self._counters[metric].add(value, clean(attributes))

    def record(self, metric: str, value: float, attributes: Attributes | None = None) -> None:
        self._histograms[metric].record(value, clean(attributes))

    def flush(self) -> None:
        for provider in (self._tracer_provider or trace.get_tracer_provider(),
                         self._meter_provider or metrics.get_meter_provider()):  # fmt: skip
            force_flush = getattr(provider, "force_flush", None)
            if callable(force_flush):
                try:
                    force_flush(5000)
                except Exception:  # an unreachable collector must not fail the command
                    log.warning("telemetry: flushing %s failed", type(provider).__name__, exc_info=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandforge")
    except PackageNotFoundError:
        return "0"


def _exporters(variable: str) -> list[str]:
    names = [n.strip().lower() for n in os.environ.get(variable, "otlp").split(",") if n.strip()]
    unknown = sorted(set(names) - {"otlp", "console", "none"})
    if unknown:
        raise ValueError(f"{variable}: unsupported exporter(s) {', '.join(unknown)} (otlp, console or none)")
    return [n for n in names if n != "none"]


def _resource() -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        resource = resource.merge(Resource({SERVICE_NAME: "sandforge"}))
    return resource


def _exporters_from_env(variable: str, console: Callable[[], T], otlp: Callable[[], T]) -> list[T]:
    """One exporter per name ``variable`` lists (``console`` or ``otlp``, the default; ``none``: none); the
    OTLP exporter's module is imported only when it is asked for."""
    return [console() if name == "console" else otlp() for name in _exporters(variable)]


def _otlp_span_exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _otlp_metric_exporter() -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def _tracer_provider_from_env() -> TracerProvider:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = SdkTracerProvider(resource=_resource())
    for exporter in _exporters_from_env("OTEL_TRACES_EXPORTER", ConsoleSpanExporter, _otlp_span_exporter):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _meter_provider_from_env() -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader

    exporters = _exporters_from_env("OTEL_METRICS_EXPORTER", ConsoleMetricExporter, _otlp_metric_exporter)
    readers: list[MetricReader] = [PeriodicExportingMetricReader(exporter) for exporter in exporters]
    return SdkMeterProvider(resource=_resource(), metric_readers=readers)
