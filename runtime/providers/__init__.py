"""Model providers: turn one dynamic call into a tool program.

provider = AnthropicProvider(model="claude-sonnet-4-6")      # real model, forced tool call
provider = ScriptedProvider(["return args[0] + 1"])          # replays programs, records prompts

The names below load on first use: the chat providers live in this folder too (``chat.py``), and importing
them (``runtime.sessions`` does) must not pull in the program providers' models, the store they name, or
the anthropic SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandforge.runtime.providers.anthropic_provider import AnthropicProvider
    from sandforge.runtime.providers.base import (
        AttemptFeedback,
        GeneratedProgram,
        GenerationRequest,
        InvalidProviderOutput,
        Provider,
        ProviderError,
        ToolContract,
    )
    from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME, PROGRAM_TOOL_SCHEMA, RenderedPrompt, render_prompt
    from sandforge.runtime.providers.scripted import ScriptedProvider, load_script

#: Where each public name lives (module of this package).
_HOMES = {
    "AnthropicProvider": "anthropic_provider",
    "AttemptFeedback": "base",
    "GeneratedProgram": "base",
    "GenerationRequest": "base",
    "InvalidProviderOutput": "base",
    "Provider": "base",
    "ProviderError": "base",
    "ToolContract": "base",
    "PROGRAM_TOOL_NAME": "prompt",
    "PROGRAM_TOOL_SCHEMA": "prompt",
    "RenderedPrompt": "prompt",
    "render_prompt": "prompt",
    "ScriptedProvider": "scripted",
    "load_script": "scripted",
}

__all__ = [
    "PROGRAM_TOOL_NAME",
    "PROGRAM_TOOL_SCHEMA",
    "AnthropicProvider",
    "AttemptFeedback",
    "GeneratedProgram",
    "GenerationRequest",
    "InvalidProviderOutput",
    "Provider",
    "ProviderError",
    "RenderedPrompt",
    "ScriptedProvider",
    "ToolContract",
    "load_script",
    "render_prompt",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
