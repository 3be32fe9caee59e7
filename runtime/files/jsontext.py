"""JSON at the edges: strict, bounded decoding of input files and compact, bounded encoding of output.

Decoding uses ``pydantic_core.from_json`` (Rust, no Python recursion): nesting deeper than 200 levels,
integers past Python's 4,300-digit limit, invalid UTF-8, lone surrogate escapes and NaN/Infinity are all
one-line errors in time linear in the input. A literal that overflows to infinity (``1e400``) is refused
too; the walk that looks for one runs only when the text holds a long exponent or digit run. A UTF-8
byte-order mark is skipped (editors write one); UTF-16/32 text is refused.

Encoding is compact (no indentation: indenting grows with depth, a 130 KB value once printed as 48 MB)
and bounded: over the limit is an OutputTooLargeError, never a partial write.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pydantic_core

from sandforge.runtime.errors import InputFileError, OutputTooLargeError, SandforgeError
from sandforge.runtime.gc_pause import gc_paused

UTF8_BOM = b"\xef\xbb\xbf"
_WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff")
#: Only a text with an exponent of 3+ digits or a 300+ digit run can hold a float literal that overflows.
_MAYBE_HUGE = re.compile(rb"[eE][+]?[0-9]{3}|[0-9]{300}")


def one_line(text: str) -> str:
    return " ".join(text.split())


def _non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def decode_json(raw: bytes, *, what: str) -> Any:
    """Parse ``raw`` strictly; InputFileError (exit 2) naming ``what`` when it is not acceptable JSON."""
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM) :]
    elif raw.startswith(_WIDE_BOMS):
        raise InputFileError(f"{what} starts with a UTF-16/32 byte-order mark; sandforge reads UTF-8 JSON")
    try:
        with gc_paused():  # millions of small containers: the cyclic GC would rescan them over and over
            value = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise InputFileError(f"{what} is not valid JSON: {one_line(str(exc))}") from None
    if _MAYBE_HUGE.search(raw) and _non_finite(value):
        raise InputFileError(f"{what} is not valid JSON: a number overflows to infinity")
    return value


def encode_compact(value: Any, *, limit: int, what: str, default: Callable[[Any], Any] | None = None) -> bytes:
    """``value`` as compact UTF-8 JSON, at most ``limit`` bytes, else OutputTooLargeError."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=default)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SandforgeError(f"{what} is not JSON: {one_line(str(exc))}") from None
    data = text.encode("utf-8", "backslashreplace")  # a lone surrogate becomes its \\udxxx escape: still JSON
    if len(data) > limit:
        raise OutputTooLargeError(
            f"{what} is {len(data)} bytes of JSON, over the message limit of {limit} bytes; nothing was written",
            hint="keep less state, or raise Limits.max_message_bytes",
        )
    return data
