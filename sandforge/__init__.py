"""sandforge: run LLM-generated tools safely and let them get better over time.

The one import package a user needs::

    from sandforge import Agent, Sandbox, ToolStore
    from sandforge import AsyncAgent, AsyncSandbox     # the same, awaited

The repository keeps its architecture's folders at the top (``runtime/``, ``sandbox/``, ``policies/``,
``images/``); installing maps them beneath this package (``sandforge.runtime``, ``sandforge.sandbox``, ...),
so site-packages gains exactly one top-level name. The names below load on first use: importing
``sandforge`` alone stays cheap (the CLI and the sandbox's host side import only what they need).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.agent import Agent, AsyncAgent
    from sandforge.runtime.store import ToolStore
    from sandforge.sandbox import AsyncSandbox, Sandbox, SandboxConfig

#: The release (pyproject.toml's ``project.version``, which a test keeps equal): read from here, not from the
#: installed metadata, whose import (``importlib.metadata``: email, zipfile) costs ``sandforge --version`` and the
#: MCP handshake more than everything else they load.
__version__ = "0.1.0"

__all__ = ["Agent", "AsyncAgent", "AsyncSandbox", "Sandbox", "SandboxConfig", "ToolStore"]

_EXPORTS = {
    "Agent": "sandforge.runtime.agent",
    "AsyncAgent": "sandforge.runtime.agent",
    "AsyncSandbox": "sandforge.sandbox",
    "Sandbox": "sandforge.sandbox",
    "SandboxConfig": "sandforge.sandbox",
    "ToolStore": "sandforge.runtime.store",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
