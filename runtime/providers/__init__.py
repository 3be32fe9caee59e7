"""Model providers: turn one dynamic call into a tool program.

provider = AnthropicProvider(model="claude-sonnet-4-6")      # real model, forced tool call
provider = OpenAIProvider(base_url="http://127.0.0.1:11434/v1", model="qwen3")  # any OpenAI-compatible endpoint
provider = RecordingProvider(provider, "session.jsonl")     # ... and every exchange written down
provider = ReplayProvider("session.jsonl")                  # that session again, with no model
provider = ScriptedProvider(["return args[0] + 1"])          # replays programs, records prompts

The names below load on first use: the chat providers live in this folder too (``chat.py``), and importing
them (``runtime.sessions`` does) must not pull in the program providers' models, the store they name, or
an SDK (``anthropic``, ``openai``: each only when its provider is built).
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
    from sandforge.runtime.providers.openai_provider import OpenAIProvider
    from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME, PROGRAM_TOOL_SCHEMA, RenderedPrompt, render_prompt
    from sandforge.runtime.providers.replay import RecordingProvider, ReplayMismatch, ReplayProvider
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
    "OpenAIProvider": "openai_provider",
    "RecordingProvider": "replay",
    "ReplayMismatch": "replay",
    "ReplayProvider": "replay",
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
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "RecordingProvider",
    "RenderedPrompt",
    "ReplayMismatch",
    "ReplayProvider",
    "ScriptedProvider",
    "ToolContract",
    "load_script",
    "render_prompt",
]


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{home}" for name, home in _HOMES.items()})
