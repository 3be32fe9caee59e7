"""The Anthropic SDK, set up and read in one place for both model providers.

The program provider (``AnthropicProvider``, which writes tool programs for the Agent) and the chat provider
(``AnthropicChatProvider``, which answers a session's conversation) create their client with
:func:`make_client` and turn every SDK failure into the same :class:`ApiFailure` with :func:`classify`
(one exception map: which failures are worth retrying, and a bounded message that never includes a request
body or a key; the failure shape and the status lanes are every transport's, ``transport``). Each provider
then raises its own typed error from it.
"""

from __future__ import annotations

import os
from typing import Any

import anthropic

from sandforge.runtime.providers.transport import ApiFailure, body_message, bounded, status_failure

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


def classify(exc: anthropic.AnthropicError) -> ApiFailure:
    """The one exception map of the Anthropic SDK (its messages are bounded and carry no request body)."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ApiFailure("the Anthropic API timed out", retriable=True, kind="timeout")
    if isinstance(exc, anthropic.APIConnectionError):
        return ApiFailure(bounded(f"cannot reach the Anthropic API: {exc}"), retriable=True, kind="connection")
    if isinstance(exc, anthropic.APIStatusError):
        return status_failure(exc.status_code, f"Anthropic API error {exc.status_code}: {api_message(exc)}")
    if isinstance(exc, anthropic.APIResponseValidationError):
        message = bounded(f"unexpected response from the Anthropic API: {exc}")
        return ApiFailure(message, retriable=True, kind="invalid_payload", invalid_output=True)
    if isinstance(exc, anthropic.APIError):
        return ApiFailure(bounded(f"Anthropic API error: {exc}"), retriable=True, kind="api_error")
    return ApiFailure(bounded(f"anthropic client error: {exc}"), retriable=False, kind="client")


def api_message(exc: anthropic.APIStatusError) -> str:
    """The API's own error message from the response body, else the SDK's."""
    return body_message(exc.body, exc.message)
