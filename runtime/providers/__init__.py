"""Model providers: turn one dynamic call into a tool program.

provider = AnthropicProvider(model="claude-sonnet-4-6")      # real model, forced tool call
provider = ScriptedProvider(["return args[0] + 1"])          # replays programs, records prompts

The names below load on first use: the chat providers live in this folder too (``chat.py``), and importing
them (``runtime.sessions`` does) must not pull in the program providers' models, the store they name, or
the anthropic SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{home}" for name, home in _HOMES.items()})
