"""The telemetry seam: a no-op :class:`Telemetry` unless OpenTelemetry is wanted and installed.

Standard library only: importing this module never imports ``opentelemetry``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from sandforge.runtime.telemetry.base import METRICS, NULL, NULL_SPAN, Attributes, SpanHandle, Telemetry, clean

log = logging.getLogger(__name__)

ENABLE_ENV = "SANDFORGE_OTEL"
RECORD_IO_ENV = "SANDFORGE_OTEL_RECORD_IO"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
#: Standard OpenTelemetry variables that, set, mean "export": any of them turns telemetry on.
OTEL_SWITCHES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
)


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    value = environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return None if value == "" else False
    raise ValueError(f"{name} must be 1 or 0 (true/false), not {value!r}")


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether telemetry is asked for: ``SANDFORGE_OTEL`` decides when set; else any standard exporter
    variable (``OTEL_EXPORTER_OTLP_*ENDPOINT``, ``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER`` other than
    ``none``) turns it on, and ``OTEL_SDK_DISABLED=true`` off."""
    env = os.environ if environ is None else environ
    explicit = _flag(env, ENABLE_ENV)
    if explicit is not None:
        return explicit
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(k, "").strip().lower() not in ("", "none") for k in OTEL_SWITCHES)


def record_io_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether programs' arguments and results go into spans (``SANDFORGE_OTEL_RECORD_IO=1``; off by default)."""
    return bool(_flag(os.environ if environ is None else environ, RECORD_IO_ENV))


_lock = threading.Lock()
_active: Telemetry | None = None


def current() -> Telemetry:
    """The active telemetry, decided on first use from the environment (then fixed until :func:`reset`)."""
    active = _active
    if active is not None:
        return active
    return _decide()


def _decide() -> Telemetry:
    global _active
    with _lock:
        if _active is None:
            _active = _from_environment()
        return _active


def _from_environment() -> Telemetry:
    try:
        if not wanted():
            return NULL
        record_io = record_io_wanted()
    except ValueError as exc:
        log.warning("telemetry off: %s", exc)
        return NULL
    try:  # opentelemetry-api alone imports; its SDK and exporters (the extra) are imported in the set-up
        from sandforge.runtime.telemetry.otel import OtelTelemetry

        return OtelTelemetry.from_environment(record_io=record_io)
    except ImportError as exc:  # one line on every command, never a traceback
        log.warning("telemetry off: asked for, but %s (pip install 'sandforge[otel]')", _missing(exc))
        return NULL
    except Exception as exc:  # a bad exporter setting must not stop the tools
        log.warning("telemetry off: it could not be set up: %s: %s", type(exc).__name__, " ".join(str(exc).split()))
        return NULL


def _missing(exc: ImportError) -> str:
    """What is missing, as one phrase: the module an import did not find, else the error's own words."""
    return f"{exc.name} is not installed" if exc.name else " ".join(str(exc).split())


def configure(
    tracer_provider: Any = None,
    meter_provider: Any = None,
    *,
    record_io: bool = False,
) -> Telemetry:
    """Use these OpenTelemetry providers (the global ones when None) from now on, whatever the environment
    says: for applications that set up OpenTelemetry themselves, and for tests (the SDK's in-memory
    exporter). Needs the ``otel`` extra."""
    global _active
    from sandforge.runtime.telemetry.otel import OtelTelemetry

    made = OtelTelemetry(tracer_provider, meter_provider, record_io=record_io)
    with _lock:
        _active = made
    return made


def flush() -> None:
    """Export what the active telemetry buffered (nothing when none was made: nothing is imported)."""
    active = _active
    if active is not None:
        active.flush()


def reset(to: Telemetry | None = None) -> None:
    """Forget the active telemetry (the next :func:`current` decides again), or set it to ``to``."""
    global _active
    with _lock:
        _active = to


__all__ = [
    "METRICS",
    "NULL",
    "NULL_SPAN",
    "Attributes",
    "SpanHandle",
    "Telemetry",
    "clean",
    "configure",
    "current",
    "flush",
    "record_io_wanted",
    "reset",
    "wanted",
]
