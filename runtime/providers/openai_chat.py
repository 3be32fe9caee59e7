"""OpenAIChatProvider: a chat session's conversation on an OpenAI-compatible chat-completions endpoint.

Sessions keep their transcript in one shape (the Messages API's content blocks, ``runtime.sessions.history``);
this provider translates it to chat-completions messages on the way out (``tool_use`` blocks become the
assistant's ``tool_calls``, ``tool_result`` blocks ``tool`` messages, tools become ``function`` tools) and the
answer back to :class:`ChatResponse` blocks, so the session loop never knows which API it talks to.
"""

from __future__ import annotations

import json
from typing import Any

from sandforge.runtime.providers.chat import (
    ChatProviderError,
    ChatRequest,
    ChatResponse,
    TextBlock,
    ToolUseBlock,
    chat_error,
)
from sandforge.runtime.providers.openai_client import ERRORS, OpenAICompatible
from sandforge.runtime.providers.transport import mapped

#: chat-completions ``finish_reason`` -> the session's ``stop_reason``.
STOP_REASONS = {"tool_calls": "tool_use", "function_call": "tool_use", "stop": "end_turn", "length": "max_tokens"}


class OpenAIChatProvider(OpenAICompatible):
    """The chat-completions API with tools; settings, key and client as every :class:`OpenAICompatible`."""

    name = "openai"
    default_timeout_s = 120.0

    def unavailable(self, message: str, *, hint: str | None = None) -> None:
        """A session cannot start without its model: refused at once."""
        raise ChatProviderError(message, hint=hint)

    def complete(self, request: ChatRequest) -> ChatResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": to_openai_messages(request.system, request.messages),
        }
        if request.tools:
            kwargs["tools"] = [to_openai_tool(t) for t in request.tools]
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.client is None:  # not reached: the constructor raised (unavailable)
            raise ChatProviderError(self.client_error or "no OpenAI client")
        with mapped(ERRORS, into=chat_error):
            resp = self.client.chat.completions.create(**kwargs)
        return from_completion(resp)


def to_openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def to_openai_messages(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session transcript (content blocks) as chat-completions messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for msg in messages:
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": _text_of(content)}]
        if msg.get("role") == "assistant":
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}}
                     for b in blocks if b.get("type") == "tool_use"]  # fmt: skip
            item: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                item["tool_calls"] = calls
            out.append(item)
            continue
        for b in blocks:  # tool results first: each answers a call of the assistant message just before
            if b.get("type") == "tool_result":
                result = _text_of(b.get("content"))
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": f"error: {result}" if b.get("is_error") else result})  # fmt: skip
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if text:
            out.append({"role": "user", "content": text})
    return out


def from_completion(resp: Any) -> ChatResponse:
    """A chat completion's first choice as content blocks; arguments that are not a JSON object become ``{}``."""
    choices = getattr(resp, "choices", None) or []
    if not choices:
        raise ChatProviderError("the OpenAI-compatible API answered without a choice", retriable=True)
    choice = choices[0]
    message = choice.message
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=message.content)] if message.content else []
    for call in message.tool_calls or []:
        function = getattr(call, "function", None)
        if function is None:
            continue  # a custom (non-function) tool call carries nothing the loop acts on
        try:
            arguments = json.loads(function.arguments or "{}")
        except ValueError:
            arguments = {}
        tool_input = arguments if isinstance(arguments, dict) else {}
        blocks.append(ToolUseBlock(id=call.id, name=function.name, input=tool_input))
    usage = getattr(resp, "usage", None)
    tokens = {"input_tokens": getattr(usage, "prompt_tokens", None),
              "output_tokens": getattr(usage, "completion_tokens", None)}  # fmt: skip
    return ChatResponse(
        content=blocks,
        stop_reason=STOP_REASONS.get(choice.finish_reason or "", choice.finish_reason),
        model=resp.model,
        usage={k: int(v) for k, v in tokens.items() if v is not None},
    )
