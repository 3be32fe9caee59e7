"""The OpenAI SDK, set up and read in one place for both OpenAI-compatible providers.

The program provider (``OpenAIProvider``) and the chat provider (``OpenAIChatProvider``) speak the
chat-completions protocol that OpenAI, Azure, Gemini's OpenAI endpoint, OpenRouter, Groq, Together, DeepSeek
and local servers (vLLM, Ollama, LM Studio, llama.cpp) all serve. Both create their client with
:func:`make_client` (where the endpoint, the key and the model come from) and turn every SDK failure into an
:class:`~sandforge.runtime.providers.transport.ApiFailure` with :func:`classify`. Retries on 429 and 5xx,
with backoff that honours ``Retry-After``, are the SDK's own (``max_retries``): no second loop here.

The key is never logged, never put in an error message, a record or a repr: it lives in the SDK client only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import openai

from sandforge.runtime.providers.transport import ApiFailure, body_message, bounded, status_failure

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


def classify(exc: openai.OpenAIError) -> ApiFailure:
    """The one exception map of the OpenAI SDK (its messages are bounded and carry no request body or key)."""
    if isinstance(exc, openai.APITimeoutError):
        return ApiFailure("the OpenAI-compatible API timed out", retriable=True, kind="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ApiFailure(bounded(f"cannot reach the OpenAI-compatible API: {exc}"), retriable=True, kind="connection")
    if isinstance(exc, openai.APIStatusError):
        detail = body_message(exc.body, exc.message)
        return status_failure(exc.status_code, f"OpenAI-compatible API error {exc.status_code}: {detail}")
    if isinstance(exc, openai.APIResponseValidationError):
        message = bounded(f"unexpected response from the OpenAI-compatible API: {exc}")
        return ApiFailure(message, retriable=True, kind="invalid_payload", invalid_output=True)
    if isinstance(exc, openai.APIError):
        return ApiFailure(bounded(f"OpenAI-compatible API error: {exc}"), retriable=True, kind="api_error")
    return ApiFailure(bounded(f"openai client error: {exc}"), retriable=False, kind="client")
