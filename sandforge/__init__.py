"""sandforge: run LLM-generated tools safely and let them get better over time.

The one import package a user needs::

    from sandforge import Agent, Sandbox, ToolStore

The repository keeps its architecture's folders at the top (``runtime/``, ``sandbox/``, ``policies/``,
``images/``); installing maps them beneath this package (``sandforge.runtime``, ``sandforge.sandbox``, ...),
so site-packages gains exactly one top-level name. The names below load on first use: importing
``sandforge`` alone stays cheap (the CLI and the sandbox's host side import only what they need).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.agent import Agent
    from sandforge.runtime.store import ToolStore
    from sandforge.sandbox import Sandbox, SandboxConfig

__all__ = ["Agent", "Sandbox", "SandboxConfig", "ToolStore"]

_EXPORTS = {
    "Agent": "sandforge.runtime.agent",
    "Sandbox": "sandforge.sandbox",
    "SandboxConfig": "sandforge.sandbox",
    "ToolStore": "sandforge.runtime.store",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
