"""A provider by name, for every place that names one: ``chat --provider``, ``mcp --provider``, ``serve`` tenants.

``ModelSettings`` holds what a live model needs (model, base URL, the *name* of the key's variable, sampling,
timeouts, retries, an optional recording file); :func:`program_provider` and :func:`chat_provider` build the
program writer and the chat model of one kind from it. Each SDK is imported only when its kind is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.providers.base import Provider
from sandforge.runtime.providers.chat import ChatProvider
from sandforge.runtime.providers.settings import ModelSettings as ModelSettings  # its home; re-exported for callers

#: The model kinds: live ones (``anthropic``, ``openai``) and the recording they made (``replay``).
LiveKind = Literal["anthropic", "openai"]
LIVE_KINDS: tuple[str, ...] = ("anthropic", "openai")


class ProviderUnavailable(SandforgeError):
    """A provider cannot be built (a missing key, an unreadable recording)."""


def key_for(kind: str, settings: ModelSettings) -> str:
    """The key of a live kind from its variable; ProviderUnavailable (naming the variable, never a value)."""
    import os

    if kind == "anthropic":
        names: tuple[str, ...] = (settings.api_key_env or "ANTHROPIC_API_KEY",)
    else:
        from sandforge.runtime.providers.openai_client import KEY_ENVS

        names = (settings.api_key_env,) if settings.api_key_env else KEY_ENVS
    key = next((v for name in names if (v := os.environ.get(name))), "")
    if not key:
        label = "Anthropic" if kind == "anthropic" else "OpenAI-compatible"
        raise ProviderUnavailable(f"no {label} API key: the environment variable {' or '.join(names)} is not set",
                                  hint="a local server that needs no key takes any value" if kind == "openai" else None)
    return key


def _recording(replay: Path | None) -> Path:
    if replay is None:
        raise ProviderUnavailable("a replay provider needs a recording file")
    return replay


def program_provider(kind: str, settings: ModelSettings, *, replay: Path | None = None) -> Provider:
    """The program writer of a live kind (recording when ``settings.record``), or ``replay``'s."""
    provider: Any
    if kind == "replay":
        from sandforge.runtime.providers.replay import ReplayProvider

        return ReplayProvider(_recording(replay))
    common: dict[str, Any] = {"max_tokens": settings.max_tokens, "timeout_s": settings.timeout_s,
                              "max_retries": settings.max_retries, "temperature": settings.temperature,
                              "api_key": key_for(kind, settings)}  # fmt: skip
    if settings.model:
        common["model"] = settings.model
    if kind == "anthropic":
        from sandforge.runtime.providers.anthropic_provider import AnthropicProvider

        provider = AnthropicProvider(base_url=settings.base_url, **common)
    elif kind == "openai":
        from sandforge.runtime.providers.openai_provider import OpenAIProvider

        provider = OpenAIProvider(base_url=settings.base_url, **common)
    else:
        raise ProviderUnavailable(f"unknown model provider {kind!r} (known: {', '.join((*LIVE_KINDS, 'replay'))})")
    if settings.record is not None:
        from sandforge.runtime.providers.replay import RecordingProvider

        return RecordingProvider(provider, settings.record)
    return provider  # type: ignore[no-any-return]


def chat_provider(kind: str, settings: ModelSettings, *, replay: Path | None = None) -> ChatProvider:
    """The chat model of a live kind (recording when ``settings.record``), or ``replay``'s."""
    provider: Any
    if kind == "replay":
        from sandforge.runtime.providers.replay import ReplayChatProvider

        return ReplayChatProvider(_recording(replay))
    key = key_for(kind, settings)
    if kind == "anthropic":
        from sandforge.runtime.providers.chat import AnthropicChatProvider

        provider = AnthropicChatProvider(model=settings.model, api_key=key, base_url=settings.base_url,
                                         max_tokens=settings.max_tokens, timeout_s=settings.timeout_s,
                                         max_retries=settings.max_retries)  # fmt: skip
    elif kind == "openai":
        from sandforge.runtime.providers.openai_chat import OpenAIChatProvider

        provider = OpenAIChatProvider(
            model=settings.model, base_url=settings.base_url, api_key=key, max_tokens=settings.max_tokens,
            temperature=settings.temperature, timeout_s=settings.timeout_s, max_retries=settings.max_retries,
        )  # fmt: skip
    else:
        raise ProviderUnavailable(f"unknown chat provider {kind!r} (known: {', '.join((*LIVE_KINDS, 'replay'))})")
    if settings.record is not None:
        from sandforge.runtime.providers.replay import RecordingChatProvider

        return RecordingChatProvider(provider, settings.record)
    return provider  # type: ignore[no-any-return]
