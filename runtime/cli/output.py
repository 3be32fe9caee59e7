"""Machine-readable output of every command: compact JSON, bounded, timestamps in RFC 3339 UTC."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

#: The most any ``--json`` listing prints (the registry's and sessions' own caps are below this).
MAX_JSON_OUTPUT_BYTES = 256 * 1024 * 1024


def rfc3339(value: datetime | float) -> str:
    """One timestamp format in every JSON output and log: RFC 3339, UTC, ``Z`` (``2026-11-26T15:02:11.123456Z``).
    A float is seconds since the epoch; a naive datetime is taken as UTC."""
    if isinstance(value, datetime):
        moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    else:
        moment = datetime.fromtimestamp(value, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def json_default(fallback: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """A JSON ``default`` that writes datetimes in RFC 3339 UTC, then asks ``fallback`` (else refuses)."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return rfc3339(value)
        if fallback is not None:
            return fallback(value)
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return default


def emit_json(payload: Any, *, limit: int = MAX_JSON_OUTPUT_BYTES, default: Callable[[Any], Any] | None = None) -> None:
    """Print ``payload`` as one line of compact JSON (indenting grows with depth); bounded by ``limit``.
    Datetimes are RFC 3339 UTC strings."""
    from sandforge.runtime.files import encode_compact  # pydantic_core: only a command that prints JSON pays it

    click.echo(encode_compact(payload, limit=limit, what="the JSON output", default=json_default(default)))
