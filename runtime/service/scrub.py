"""Host paths out of responses: every string a response carries passes through :class:`Scrubber`, which
replaces the host's own directories (the installed package, the interpreter's prefix, state directories, the
temporary directory, the home directory) with ``<host>``. Error messages, stderr and outcome metadata are
written by many layers; this is the one place that guarantees none of them leaks where things live."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sandforge

PLACEHOLDER = "<host>"


def host_prefixes(extra: Iterable[Path] = ()) -> list[str]:
    """The directories whose names must not leave the host (longest first, so the most specific wins)."""
    package = Path(sandforge.__file__).resolve().parent
    candidates = {
        package, package.parent, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent,
        Path(tempfile.gettempdir()), Path.home(), *extra,
    }  # fmt: skip
    out: set[str] = set()
    for p in candidates:
        for variant in (p, p.resolve()):
            text = str(variant)
            if len(text) > 1:  # never "/"
                out.add(text)
    # a package linked into site-packages (sandforge/runtime -> ../runtime) shows the link targets too
    for name in ("runtime", "sandbox", "policies", "images"):
        target = (package / name).resolve()
        out.add(str(target.parent))
    return sorted(out, key=len, reverse=True)


class Scrubber:
    def __init__(self, prefixes: Iterable[str]) -> None:
        items = [p for p in prefixes if p]
        self._pattern = re.compile("|".join(re.escape(p) for p in items)) if items else None
        # the same prefixes as they appear inside JSON text (escaped the way json.dumps escapes them): a match
        # in encoded text is a match inside one string, since an escaped prefix holds no bare quote
        escaped = [json.dumps(p, ensure_ascii=False)[1:-1] for p in items]
        self._json_pattern = re.compile("|".join(re.escape(p) for p in escaped)) if items else None

    def json_bytes(self, value: Any) -> bytes:
        """``value`` encoded as a JSON response body (compact, UTF-8), every string scrubbed: one pass over
        the encoded text instead of a walk over the value (the same result as encoding ``self(value)``)."""
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        if self._json_pattern is not None:
            text = self._json_pattern.sub(PLACEHOLDER, text)
        return text.encode("utf-8")

    def text(self, value: str) -> str:
        if self._pattern is None:
            return value
        return self._pattern.sub(PLACEHOLDER, value)

    def __call__(self, value: Any) -> Any:
        """``value`` with every string (keys included) scrubbed; other JSON values unchanged."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        return value
