"""Optional OpenTelemetry traces and metrics (issue 21), behind one small seam.

The rest of sandforge calls :func:`current` and the methods of the :class:`Telemetry` it returns; only
``runtime/telemetry/otel.py`` imports ``opentelemetry``, and only when telemetry is wanted (``SANDFORGE_OTEL=1``
or the standard ``OTEL_*`` exporter variables, see :func:`wanted`) and the ``sandforge[otel]`` extra is
installed. Otherwise :func:`current` is a no-op object whose spans are one shared instance: nothing is
imported and a call pays a few attribute look-ups.
"""

from __future__ import annotations

from sandforge.runtime.telemetry.api import (
    NULL,
    NULL_SPAN,
    Attributes,
    SpanHandle,
    Telemetry,
    configure,
    current,
    flush,
    record_io_wanted,
    reset,
    wanted,
)

__all__ = [
    "NULL",
    "NULL_SPAN",
    "Attributes",
    "SpanHandle",
    "Telemetry",
    "configure",
    "current",
    "flush",
    "record_io_wanted",
    "reset",
    "wanted",
]
