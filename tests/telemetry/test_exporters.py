"""The exporters the standard variables ask for, from the one builder both providers use."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from sandforge.runtime.telemetry import otel


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ["otlp"]),
        ("console", ["console"]),
        ("console, otlp", ["console", "otlp"]),
        ("none", []),
    ],
)
def test_each_listed_exporter_is_built_for_traces_and_metrics(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: list[str]
) -> None:
    kinds = {"console": (ConsoleSpanExporter, ConsoleMetricExporter), "otlp": (OTLPSpanExporter, OTLPMetricExporter)}
    for variable, column in (("OTEL_TRACES_EXPORTER", 0), ("OTEL_METRICS_EXPORTER", 1)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
        console, otlp = (kinds["console"][column], kinds["otlp"][column])
        built = otel._exporters_from_env(variable, console, otlp)
        assert [type(e) for e in built] == [kinds[name][column] for name in expected]


def test_an_unknown_exporter_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,zipkin")
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER: unsupported exporter"):
        otel._tracer_provider_from_env()
