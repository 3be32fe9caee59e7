"""OpenTelemetry through the SDK's in-memory exporter and reader (never the global providers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the telemetry tests need the otel extra (a dev dependency)")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandforge.runtime import telemetry
from sandforge.runtime.guardrails import Policy, default_policy, load_policy


@dataclass
class Otel:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def one(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        assert parent.context is not None
        return [s for s in self.spans() if s.parent is not None and s.parent.span_id == parent.context.span_id]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value) of every data point of ``metric`` (a counter's sum, a histogram's count)."""
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        for p in m.data.data_points:
                            found.append((dict(p.attributes or {}), getattr(p, "value", getattr(p, "count", None))))
        return found


def _make(record_io: bool) -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider, meter_provider, record_io=record_io)
    try:
        yield Otel(exporter, reader)
    finally:
        telemetry.reset()
        tracer_provider.shutdown()
        meter_provider.shutdown()


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from _make(record_io=False)


@pytest.fixture
def otel_io() -> Iterator[Otel]:
    yield from _make(record_io=True)


def loopback_egress_policy(directory: Path, port: int, token_env: str) -> Policy:
    """The default policy with egress to ``allowed.test`` on a loopback server at ``port`` (``denied.test``
    resolves there too, and is refused) and a bearer credential from ``token_env`` injected for it: what the
    span tests fetch with, to check that no URL path, query or credential reaches an attribute."""
    directory.mkdir()
    (directory / "egress.yaml").write_text(
        "grant: [http_fetch]\negress:\n  allow:\n"
        f'    - {{url: "http://allowed.test:{port}/**", name: loopback}}\n'
        '  allow_ranges: ["127.0.0.1/32"]\n  resolve: {allowed.test: 127.0.0.1, denied.test: 127.0.0.1}\n'
        "  credentials:\n    - {host: allowed.test, header: Authorization, "
        f'value: "Bearer ${{{token_env}}}", schemes: [http]}}\n'
    )
    return load_policy([*default_policy().sources, directory])
