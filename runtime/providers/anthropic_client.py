"""The Anthropic SDK, set up and read in one place for both model providers.

The program provider (``AnthropicProvider``, which writes tool programs for the Agent) and the chat provider
(``AnthropicChatProvider``, which answers a session's conversation) create their client with
:func:`make_client` and turn every SDK failure into the same :class:`ApiFailure` through :data:`ERRORS`, this
SDK's table of the one exception map (``transport.classify``: which failures are worth retrying, and a bounded
message that never includes a request body or a key). Each provider then raises its own typed error from it.
"""

from __future__ import annotations

import os
from typing import Any

import anthropic

from sandforge.runtime.providers import transport
from sandforge.runtime.providers.transport import ApiFailure, SdkErrors

DEFAULT_MODEL = "claude-sonnet-4-6"
#: Where the SDK finds credentials without a configured profile.
CREDENTIAL_ENVS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")


def make_client(
    *, timeout_s: float, max_retries: int, api_key: str | None = None, base_url: str | None = None,
    http_client: Any = None,
) -> anthropic.Anthropic:  # fmt: skip
    """An SDK client; raises what the SDK raises for a bad configuration (``AnthropicError``, ``ValueError``)."""
    kwargs: dict[str, Any] = {"timeout": timeout_s, "max_retries": max_retries}
    if api_key is not None:
        kwargs["api_key"] = api_key
    if base_url is not None:
        kwargs["base_url"] = base_url
    if http_client is not None:
        kwargs["http_client"] = http_client
    return anthropic.Anthropic(**kwargs)


def has_credentials(api_key: str | None = None) -> bool:
    """A key was given, or one of :data:`CREDENTIAL_ENVS` is set."""
    return bool(api_key or any(os.environ.get(name) for name in CREDENTIAL_ENVS))


#: The Anthropic SDK's row of the one exception map (``transport.classify``).
ERRORS = SdkErrors(
    api="Anthropic", sdk="anthropic", base=anthropic.AnthropicError, timeout=anthropic.APITimeoutError,
    connection=anthropic.APIConnectionError, status=anthropic.APIStatusError,
    invalid_response=anthropic.APIResponseValidationError, api_error=anthropic.APIError,
)  # fmt: skip


def classify(exc: anthropic.AnthropicError) -> ApiFailure:
    """An Anthropic SDK failure through the one exception map."""
    return transport.classify(exc, ERRORS)
