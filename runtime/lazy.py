"""Public names that load on first use (PEP 562), for the packages whose import must stay cheap.

``sandforge`` (the API's three names), ``runtime.providers`` (the anthropic SDK, the store's models) and
``runtime.egress`` (the HTTP client, TLS) each export names whose modules are expensive; their
``__init__`` maps each name to its module and takes its module ``__getattr__``/``__dir__`` from here::

    __getattr__, __dir__ = lazy_exports(__name__, {"Name": ".module", "Other": "sandforge.x"})

A name is imported once, then kept in the package's namespace (later lookups never reach ``__getattr__``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: ``homes`` maps each exported name to the
    module that defines it (relative to ``package`` when it starts with a dot)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        sys.modules[package].__dict__[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*sys.modules[package].__dict__, *homes})

    return __getattr__, __dir__
