"""OpenAIProvider: any OpenAI-compatible chat-completions endpoint writes the program, through a forced tool call.

The same prompt as every provider (``prompt.render_prompt``: the system prompt becomes the ``system`` message,
the call the ``user`` message) and the same tool, ``submit_program`` with ``{code, dependencies?}``, forced with
``tool_choice={"type": "function", "function": {"name": "submit_program"}}``. Its arguments are read by
``transport.program_from_payload``, the Anthropic provider's reading too; API failures become the same typed
:class:`ProviderError` kinds (``transport.status_failure``), and an answer without a usable program is
:class:`InvalidProviderOutput`, retried by the lifecycle within ``generation_retry_budget``.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.openai_client import NO_KEY_HINT, MissingKey, classify, make_client, resolve
from sandforge.runtime.providers.prompt import (
    PROGRAM_TOOL_DESCRIPTION,
    PROGRAM_TOOL_NAME,
    PROGRAM_TOOL_SCHEMA,
    render_prompt,
)
from sandforge.runtime.providers.transport import (
    bounded,
    effective_timeout,
    error_for,
    malformed,
    program_from_payload,
)

PROGRAM_TOOL = {
    "type": "function",
    "function": {"name": PROGRAM_TOOL_NAME, "description": PROGRAM_TOOL_DESCRIPTION, "parameters": PROGRAM_TOOL_SCHEMA},
}


class OpenAIProvider:
    """Generates programs with the chat-completions API of ``base_url`` (default: OpenAI's).

    ``api_key``: the argument, else ``SANDFORGE_OPENAI_API_KEY``, else ``OPENAI_API_KEY``. ``http_client`` is
    for tests and proxies (an ``httpx`` client the SDK accepts)."""

    name = "openai"

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        temperature: float | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        http_client: Any = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        self._client: openai.OpenAI | None = None
        self._client_error: str | None = None
        try:
            endpoint = resolve(model=model, base_url=base_url, api_key=api_key)
        except MissingKey as exc:
            self.model = model or ""
            self.base_url = base_url
            self._client_error = f"{exc}: {NO_KEY_HINT}"
            return
        self.model, self.base_url = endpoint.model, endpoint.base_url
        try:
            self._client = make_client(endpoint, timeout_s=timeout_s, max_retries=max_retries, http_client=http_client)
        except (openai.OpenAIError, ValueError) as exc:
            self._client_error = bounded(f"cannot configure the OpenAI client: {exc}")

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        if self._client is None:
            raise ProviderError(self._client_error or "no OpenAI client", retriable=False, kind="credentials")
        prompt = render_prompt(request)
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}],
            "tools": [PROGRAM_TOOL],
            "tool_choice": {"type": "function", "function": {"name": PROGRAM_TOOL_NAME}},
        }
        if self.temperature is not None:
            params["temperature"] = self.temperature
        client = self._client
        budget = effective_timeout(self.timeout_s, request.time_budget_s)
        if budget is not None:  # the call's remaining time: one attempt, no SDK retries
            client = client.with_options(timeout=budget, max_retries=0)
        try:
            completion = client.chat.completions.create(**params)
        except openai.OpenAIError as exc:  # the API failed, or answered what the SDK cannot read
            raise error_for(classify(exc)) from exc
        except ValueError as exc:  # json.JSONDecodeError: a body that is not JSON
            raise error_for(malformed("OpenAI-compatible")) from exc
        return parse_completion(completion, default_model=self.model)


def parse_completion(completion: Any, *, default_model: str) -> GeneratedProgram:
    """The program inside a chat completion (its first choice's ``submit_program`` call), or InvalidProviderOutput."""
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise InvalidProviderOutput("the completion has no choice", kind="invalid_payload")
    choice = choices[0]
    message = getattr(choice, "message", None)
    calls = [
        c for c in getattr(message, "tool_calls", None) or []
        if getattr(getattr(c, "function", None), "name", None) == PROGRAM_TOOL_NAME
    ]  # fmt: skip
    finish = getattr(choice, "finish_reason", None)
    if not calls:
        why = " (the answer hit max_tokens)" if finish == "length" else ""
        raise InvalidProviderOutput(f"the model did not call {PROGRAM_TOOL_NAME}{why}", kind="no_tool_call")
    arguments = getattr(calls[0].function, "arguments", None)
    try:
        payload = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        if finish == "length":
            raise InvalidProviderOutput("the program was cut off at max_tokens", kind="truncated") from None
        raise InvalidProviderOutput("the tool call's arguments are not JSON", kind="invalid_payload") from None
    usage = getattr(completion, "usage", None)
    return program_from_payload(
        payload, truncated=finish == "length", provider=OpenAIProvider.name,
        model=getattr(completion, "model", None) or default_model,
        input_tokens=getattr(usage, "prompt_tokens", None), output_tokens=getattr(usage, "completion_tokens", None),
    )  # fmt: skip
