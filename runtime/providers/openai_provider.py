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

from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.openai_client import ERRORS, OpenAICompatible
from sandforge.runtime.providers.prompt import (
    PROGRAM_TOOL_DESCRIPTION,
    PROGRAM_TOOL_NAME,
    PROGRAM_TOOL_SCHEMA,
    render_prompt,
)
from sandforge.runtime.providers.transport import effective_timeout, error_for, mapped, program_from_payload

PROGRAM_TOOL = {
    "type": "function",
    "function": {"name": PROGRAM_TOOL_NAME, "description": PROGRAM_TOOL_DESCRIPTION, "parameters": PROGRAM_TOOL_SCHEMA},
}


class OpenAIProvider(OpenAICompatible):
    """Generates programs with the chat-completions API of ``base_url`` (default: OpenAI's); settings, key and
    client as every :class:`OpenAICompatible`."""

    name = "openai"

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        if self.client is None:
            raise ProviderError(self.client_error or "no OpenAI client", retriable=False, kind="credentials")
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
        client = self.client
        budget = effective_timeout(self.timeout_s, request.time_budget_s)
        if budget is not None:  # the call's remaining time: one attempt, no SDK retries
            client = client.with_options(timeout=budget, max_retries=0)
        with mapped(ERRORS, into=error_for):
            completion = client.chat.completions.create(**params)
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
