"""Model providers: turn one dynamic call into a tool program.

provider = AnthropicProvider(model="claude-sonnet-4-6")      # real model, forced tool call
provider = ScriptedProvider(["return args[0] + 1"])          # replays programs, records prompts
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from sandforge.runtime.providers.anthropic_provider import AnthropicProvider

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
    # The anthropic SDK takes a while to import; load it only when asked for.
    if name == "AnthropicProvider":
        from sandforge.runtime.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider
    raise AttributeError(name)
