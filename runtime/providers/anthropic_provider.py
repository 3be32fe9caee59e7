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

from sandforge.runtime.providers.anthropic_client import DEFAULT_MODEL, ERRORS, classify, make_client
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.prompt import (
    PROGRAM_TOOL_DESCRIPTION,
    PROGRAM_TOOL_NAME,
    PROGRAM_TOOL_SCHEMA,
    render_prompt,
)
from sandforge.runtime.providers.settings import ModelSettings
from sandforge.runtime.providers.transport import bounded, effective_timeout, error_for, mapped, program_from_payload

log = logging.getLogger(__name__)

MODEL_ENV = "SANDFORGE_ANTHROPIC_MODEL"


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
        self.settings = ModelSettings(model=model, base_url=base_url, max_tokens=max_tokens, temperature=temperature,
                                      timeout_s=timeout_s, max_retries=max_retries)  # a bad value: ValueError
        self.model = model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.temperature = temperature
        self._client: anthropic.Anthropic | None = client
        self._client_error: str | None = None
        if client is not None:
            return
        try:
            self._client = make_client(
                timeout_s=timeout_s, max_retries=max_retries, api_key=api_key, base_url=base_url,
                http_client=http_client,
            )  # fmt: skip
        except (anthropic.AnthropicError, ValueError) as exc:  # e.g. a configured profile that is missing
            self._client_error = bounded(f"cannot configure the Anthropic client: {exc}")

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
                    "description": PROGRAM_TOOL_DESCRIPTION,
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
        budget = effective_timeout(self.timeout_s, request.time_budget_s)
        if budget is not None:  # the call's remaining time: one attempt, no SDK retries
            params["timeout"] = budget
            client = client.with_options(timeout=budget, max_retries=0)
        try:
            with mapped(ERRORS, into=error_for):  # the API failed, or a bad client configuration
                message = client.messages.create(**params)
        except TypeError as exc:
            if "authentication" not in str(exc):
                raise
            # the SDK raises TypeError when it finds no credentials (no key, token or profile)
            raise ProviderError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY", retriable=False, kind="credentials"
            ) from exc
        return parse_message(message, default_model=self.model)


def map_api_error(exc: anthropic.AnthropicError) -> ProviderError:
    """One typed ProviderError per SDK failure (``anthropic_client.classify``: the one exception map)."""
    return error_for(classify(exc))


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
    usage = getattr(message, "usage", None)
    return program_from_payload(
        getattr(calls[0], "input", None), truncated=stop == "max_tokens", provider=AnthropicProvider.name,
        model=getattr(message, "model", None) or default_model, input_tokens=getattr(usage, "input_tokens", None),
        output_tokens=getattr(usage, "output_tokens", None),
    )  # fmt: skip
