"""Host paths out of responses: every string a response carries passes through :class:`Scrubber`, which
replaces the host's own directories (the installed package, the interpreter's prefix, state directories, the
temporary directory, the home directory) with ``<host>``. Error messages, stderr and outcome metadata are
written by many layers; this is the one place that guarantees none of them leaks where things live."""

from __future__ import annotations

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
