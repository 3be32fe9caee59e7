"""Machine-readable output of every command: compact JSON, bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sandforge.runtime.files import encode_compact

#: The most any ``--json`` listing prints (the registry's and sessions' own caps are below this).
MAX_JSON_OUTPUT_BYTES = 256 * 1024 * 1024


def emit_json(payload: Any, *, limit: int = MAX_JSON_OUTPUT_BYTES, default: Callable[[Any], Any] | None = None) -> None:
    """Print ``payload`` as one line of compact JSON (indenting grows with depth); bounded by ``limit``."""
    click.echo(encode_compact(payload, limit=limit, what="the JSON output", default=default))
