"""The OpenAI SDK, set up and read in one place for both OpenAI-compatible providers.

The program provider (``OpenAIProvider``) and the chat provider (``OpenAIChatProvider``) speak the
chat-completions protocol that OpenAI, Azure, Gemini's OpenAI endpoint, OpenRouter, Groq, Together, DeepSeek
and local servers (vLLM, Ollama, LM Studio, llama.cpp) all serve. Both are an
:class:`OpenAICompatible`: one constructor (its settings validated by ``ModelSettings``, the endpoint resolved by
:func:`resolve`, the client built by :func:`make_client`), and every SDK failure goes through :data:`ERRORS`,
this SDK's table of the one exception map (``transport.mapped``). Retries on 429 and 5xx,
with backoff that honours ``Retry-After``, are the SDK's own (``max_retries``): no second loop here.

The key is never logged, never put in an error message, a record or a repr: it lives in the SDK client only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import openai

from sandforge.runtime.providers.settings import ModelSettings
from sandforge.runtime.providers.transport import SdkErrors, bounded

DEFAULT_MODEL = "gpt-4.1-mini"
#: Where the key is looked for, in order: sandforge's own variable (the configuration file's
#: ``openai_api_key`` lands there), then the SDK's.
KEY_ENVS = ("SANDFORGE_OPENAI_API_KEY", "OPENAI_API_KEY")
BASE_URL_ENVS = ("SANDFORGE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
MODEL_ENV = "SANDFORGE_OPENAI_MODEL"
NO_KEY_HINT = "set OPENAI_API_KEY (or SANDFORGE_OPENAI_API_KEY); a local server that needs no key takes any value"


class MissingKey(Exception):
    """No key was given and none of :data:`KEY_ENVS` is set (each provider raises its own typed error)."""


@dataclass(frozen=True)
class Endpoint:
    """Where an OpenAI-compatible provider sends its requests. ``api_key`` is excluded from the repr."""

    base_url: str | None
    model: str
    api_key: str = field(repr=False)


def resolve(*, model: str | None, base_url: str | None, api_key: str | None) -> Endpoint:
    """Each of model, base URL and key from the argument, else the environment. Raises :class:`MissingKey`
    when no key is found."""
    key = api_key or next((v for name in KEY_ENVS if (v := os.environ.get(name))), None)
    if not key:
        raise MissingKey(f"no OpenAI-compatible API key (looked in {', '.join(KEY_ENVS)})")
    url = base_url or next((v for name in BASE_URL_ENVS if (v := os.environ.get(name))), None)
    return Endpoint(base_url=url, model=model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL, api_key=key)


def make_client(endpoint: Endpoint, *, timeout_s: float, max_retries: int, http_client: Any = None) -> openai.OpenAI:
    """An SDK client; raises what the SDK raises for a bad configuration (``OpenAIError``, ``ValueError``)."""
    kwargs: dict[str, Any] = {"api_key": endpoint.api_key, "timeout": timeout_s, "max_retries": max_retries}
    if endpoint.base_url:
        kwargs["base_url"] = endpoint.base_url
    if http_client is not None:
        kwargs["http_client"] = http_client
    return openai.OpenAI(**kwargs)


#: The OpenAI SDK's row of the one exception map (``transport.classify``).
ERRORS = SdkErrors(
    api="OpenAI-compatible", sdk="openai", base=openai.OpenAIError, timeout=openai.APITimeoutError,
    connection=openai.APIConnectionError, status=openai.APIStatusError,
    invalid_response=openai.APIResponseValidationError, api_error=openai.APIError,
)  # fmt: skip


class OpenAICompatible:
    """The head both OpenAI-compatible providers share: settings, endpoint and client, built once.

    ``api_key``: the argument, else ``SANDFORGE_OPENAI_API_KEY``, else ``OPENAI_API_KEY``; it lives in the SDK
    client only. ``http_client`` is for tests and proxies (an ``httpx`` client the SDK accepts). A bad setting
    is a ``ValueError`` now; a missing key or a configuration the SDK refuses goes to :meth:`unavailable`, which
    each provider answers in its own error type."""

    #: The request timeout when none is given (a chat turn may think longer than a program takes to write).
    default_timeout_s: ClassVar[float] = 60.0

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        temperature: float | None = None,
        timeout_s: float | None = None,
        max_retries: int = 2,
        http_client: Any = None,
    ) -> None:
        self.settings = ModelSettings(
            model=model, base_url=base_url, max_tokens=max_tokens, temperature=temperature,
            timeout_s=self.default_timeout_s if timeout_s is None else timeout_s, max_retries=max_retries,
        )  # fmt: skip
        self.model, self.base_url = model or "", base_url
        self.max_tokens, self.temperature, self.timeout_s = max_tokens, temperature, self.settings.timeout_s
        self.client: openai.OpenAI | None = None
        self.client_error: str | None = None
        try:
            endpoint = resolve(model=model, base_url=base_url, api_key=api_key)
        except MissingKey as exc:
            self.unavailable(str(exc), hint=NO_KEY_HINT)
            return
        self.model, self.base_url = endpoint.model, endpoint.base_url
        try:
            self.client = make_client(endpoint, timeout_s=self.timeout_s, max_retries=max_retries,
                                      http_client=http_client)  # fmt: skip
        except (openai.OpenAIError, ValueError) as exc:
            self.unavailable(bounded(f"cannot configure the OpenAI client: {exc}"))

    def unavailable(self, message: str, *, hint: str | None = None) -> None:
        """There is no client (no key, a configuration the SDK refuses): kept for the first request to report.
        The chat provider raises at once instead."""
        self.client_error = f"{message}: {hint}" if hint else message
