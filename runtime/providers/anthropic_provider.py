"""AnthropicProvider: Claude writes the program, returned through a forced tool call.

The request forces ``tool_choice={"type": "tool", "name": "submit_program"}`` whose input schema is
``{code: str, dependencies?: [str]}``, so the answer is structured, never prose to be scraped. Every API
failure becomes a typed :class:`ProviderError` (``provider``): retriable for timeouts, connection errors,
rate limits and server errors; not retriable for bad credentials or a request the API refuses. An answer
without a usable program is :class:`InvalidProviderOutput`, which the lifecycle retries within
``generation_retry_budget``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anthropic

from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME, PROGRAM_TOOL_SCHEMA, render_prompt

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-4-6"
MODEL_ENV = "SANDFORGE_ANTHROPIC_MODEL"
#: HTTP statuses worth retrying later (the SDK already retried them ``max_retries`` times).
RETRIABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_ERROR_CHARS = 500


class AnthropicProvider:
    """Generates programs with the Messages API. ``http_client`` is for tests (an httpx mock transport)."""

    name = "anthropic"

    def __init__(
        self,
        *,
        model: str | None = None,
        max_tokens: int = 4096,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: Any = None,
        client: anthropic.Anthropic | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.temperature = temperature
        self._client: anthropic.Anthropic | None = client
        self._client_error: str | None = None
        if client is not None:
            return
        kwargs: dict[str, Any] = {"timeout": timeout_s, "max_retries": max_retries}
        if api_key is not None:
            kwargs["api_key"] = api_key
        if base_url is not None:
            kwargs["base_url"] = base_url
        if http_client is not None:
            kwargs["http_client"] = http_client
        try:
            self._client = anthropic.Anthropic(**kwargs)
        except (anthropic.AnthropicError, ValueError) as exc:  # e.g. a configured profile that is missing
            self._client_error = _bounded(f"cannot configure the Anthropic client: {exc}")

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        prompt = render_prompt(request)
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": prompt.system,
            "messages": [{"role": "user", "content": prompt.user}],
            "tools": [
                {
                    "name": PROGRAM_TOOL_NAME,
                    "description": "Submit the tool program (a function body) for the requested call.",
                    "input_schema": PROGRAM_TOOL_SCHEMA,
                }
            ],
            "tool_choice": {"type": "tool", "name": PROGRAM_TOOL_NAME},
            "timeout": self.timeout_s,
        }
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self._client is None:
            raise ProviderError(self._client_error or "no Anthropic client", retriable=False, kind="credentials")
        client = self._client
        if request.time_budget_s is not None and request.time_budget_s < self.timeout_s:
            # the call's remaining time (docs/security.md, "Trace budget"): one attempt, no SDK retries
            params["timeout"] = request.time_budget_s
            client = client.with_options(timeout=request.time_budget_s, max_retries=0)
        try:
            message = client.messages.create(**params)
        except anthropic.APIError as exc:
            raise map_api_error(exc) from exc
        except anthropic.AnthropicError as exc:  # bad client configuration
            raise ProviderError(_bounded(f"anthropic client error: {exc}"), retriable=False, kind="client") from exc
        except TypeError as exc:
            if "authentication" not in str(exc):
                raise
            # the SDK raises TypeError when it finds no credentials (no key, token or profile)
            raise ProviderError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY", retriable=False, kind="credentials"
            ) from exc
        return parse_message(message, default_model=self.model)


def map_api_error(exc: anthropic.APIError) -> ProviderError:
    """One typed ProviderError per SDK failure; the message never includes request bodies or keys."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError("the Anthropic API timed out", retriable=True, kind="timeout")
    if isinstance(exc, anthropic.APIConnectionError):
        return ProviderError(_bounded(f"cannot reach the Anthropic API: {exc}"), retriable=True, kind="connection")
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        detail = _bounded(f"Anthropic API error {status}: {_api_message(exc)}")
        if status in (401, 403):
            return ProviderError(detail, retriable=False, kind="authentication")
        if status == 429:
            return ProviderError(detail, retriable=True, kind="rate_limit")
        if status in RETRIABLE_STATUSES or status >= 500:
            return ProviderError(detail, retriable=True, kind="server_error")
        return ProviderError(detail, retriable=False, kind="bad_request")
    if isinstance(exc, anthropic.APIResponseValidationError):
        return InvalidProviderOutput(_bounded(f"unexpected response from the Anthropic API: {exc}"))
    return ProviderError(_bounded(f"Anthropic API error: {exc}"), retriable=True, kind="api_error")


def parse_message(message: Any, *, default_model: str) -> GeneratedProgram:
    """The program inside a Messages API response, or InvalidProviderOutput."""
    blocks = getattr(message, "content", None) or []
    calls = [
        b for b in blocks if getattr(b, "type", None) == "tool_use" and getattr(b, "name", None) == PROGRAM_TOOL_NAME
    ]
    stop = getattr(message, "stop_reason", None)
    if not calls:
        why = " (the answer hit max_tokens)" if stop == "max_tokens" else ""
        raise InvalidProviderOutput(f"the model did not call {PROGRAM_TOOL_NAME}{why}", kind="no_tool_call")
    payload = getattr(calls[0], "input", None)
    if not isinstance(payload, dict):
        raise InvalidProviderOutput("the tool call input is not an object", kind="invalid_payload")
    code = payload.get("code")
    if not isinstance(code, str) or not code.strip():
        raise InvalidProviderOutput("the tool call has no 'code' string", kind="invalid_payload")
    if stop == "max_tokens":
        raise InvalidProviderOutput("the program was cut off at max_tokens", kind="truncated")
    deps = payload.get("dependencies", [])
    if deps is None:
        deps = []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise InvalidProviderOutput("'dependencies' must be a list of strings", kind="invalid_payload")
    usage = getattr(message, "usage", None)
    return GeneratedProgram(
        code=code,
        dependencies=deps,
        provider=AnthropicProvider.name,
        model=getattr(message, "model", None) or default_model,
        input_tokens=getattr(usage, "input_tokens", None),
        output_tokens=getattr(usage, "output_tokens", None),
    )


def _api_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return exc.message


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
