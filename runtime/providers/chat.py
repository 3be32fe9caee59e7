"""Chat models for the session tool-use loop (Anthropic Messages API with ``tools``).

These are *chat* providers: they answer a conversation with text and tool_use blocks. They live beside
the program-generation providers (``base.py``, ``anthropic_provider.py``, ``scripted.py``), which write tool
programs for the Agent, and share their Anthropic client set-up and exception map (``anthropic_client``).
``runtime.sessions`` re-exports them (docs/sessions.md).

- ``AnthropicChatProvider``: the ``anthropic`` SDK; API failures become typed ``ChatProviderError``s.
- ``ScriptedChatProvider``: replays scripted assistant turns in order and records every request it got
  (messages, system prompt and the tool list it was offered). Drives the demo and the tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandforge.runtime.errors import SessionError, UsageError
from sandforge.runtime.files.structured import read_data_file
from sandforge.runtime.providers.settings import ModelSettings

if TYPE_CHECKING:
    from sandforge.runtime.providers.transport import ApiFailure

DEFAULT_CHAT_MODEL = "claude-sonnet-4-6"
CHAT_MODEL_ENV = "SANDFORGE_CHAT_MODEL"


class ChatProviderError(SessionError):
    """The chat model could not be called or answered with something unusable."""

    def __init__(self, message: str, *, retriable: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retriable = retriable


def chat_error(failure: ApiFailure) -> ChatProviderError:
    """A classified SDK failure as the session's error (``transport.mapped``'s ``into`` for chat providers)."""
    return ChatProviderError(failure.message, retriable=failure.retriable)


class ScriptExhaustedError(ChatProviderError):
    """The scripted chat provider was asked for more turns than its script holds."""


class TextBlock(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["tool_use"] = "tool_use"
    id: str = Field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:24]}")
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


ContentBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]


class ChatRequest(BaseModel):
    """One model call: the transcript so far, the system prompt and the tools currently active."""

    system: str = ""
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    max_tokens: int = 4096

    @property
    def tool_names(self) -> list[str]:
        return [str(t["name"]) for t in self.tools]


class ChatResponse(BaseModel):
    content: list[ContentBlock] = Field(default_factory=list)
    stop_reason: str | None = None
    model: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]


class ChatProvider(Protocol):
    """Answers one chat request. Raises ChatProviderError (never a raw SDK exception)."""

    name: str

    def complete(self, request: ChatRequest) -> ChatResponse: ...


# --- scripted ---------------------------------------------------------------------------------------------


def parse_turn(turn: Any) -> ChatResponse:
    """A scripted turn: a string (text), ``{"content": [blocks]}``, or ``{"text": ..., "tool_calls": [...]}``
    where each tool call is ``{"name": ..., "input": {...}, "id": optional}``."""
    if isinstance(turn, ChatResponse):
        return turn
    if isinstance(turn, str):
        return ChatResponse(content=[TextBlock(text=turn)], stop_reason="end_turn")
    if not isinstance(turn, dict):
        raise ValueError(f"a scripted turn must be a string or an object, not {type(turn).__name__}")
    if "content" in turn:
        blocks = turn["content"]
    else:
        unknown = set(turn) - {"text", "tool_calls", "stop_reason"}
        if unknown:
            raise ValueError(f"unknown key(s) in scripted turn: {', '.join(sorted(unknown))}")
        blocks = [{"type": "text", "text": turn["text"]}] if turn.get("text") else []
        blocks += [{"type": "tool_use", **call} for call in turn.get("tool_calls") or []]
    response = ChatResponse.model_validate({"content": blocks, "stop_reason": turn.get("stop_reason")})
    if response.stop_reason is None:
        stop = "tool_use" if response.tool_uses else "end_turn"
        response = response.model_copy(update={"stop_reason": stop})
    return response


def read_script(path: Path) -> dict[str, Any]:
    """Read a script file (JSON, or YAML for other suffixes): a list of turns, or an object with ``turns``
    (and optionally ``programs`` for the Agent's ScriptedProvider and ``groups``)."""
    data = read_data_file(path, what="script", error=UsageError)  # bounded; strict JSON / bounded YAML
    if isinstance(data, list):
        data = {"turns": data}
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise UsageError(f"{path}: a script is a list of turns or an object with a 'turns' list")
    return data


class ScriptedChatProvider:
    """Replays assistant turns in order; ``requests`` holds every request it received (deep copies)."""

    name = "scripted"

    def __init__(self, turns: Sequence[Any]) -> None:
        try:
            self.turns = [parse_turn(t) for t in turns]
        except (ValueError, ValidationError) as exc:
            raise UsageError(f"invalid scripted turn: {exc}") from exc
        self.requests: list[ChatRequest] = []
        self._next = 0

    @classmethod
    def from_file(cls, path: Path) -> ScriptedChatProvider:
        data = read_script(path)
        try:
            return cls(data["turns"])
        except UsageError as exc:
            raise UsageError(f"{path}: {exc.message}") from exc

    @property
    def remaining(self) -> int:
        return len(self.turns) - self._next

    def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request.model_copy(deep=True))
        if self._next >= len(self.turns):
            raise ScriptExhaustedError(
                f"the scripted chat provider has no turn left (it had {len(self.turns)})",
                hint="add turns to the script",
            )
        turn = self.turns[self._next]
        self._next += 1
        # Fresh tool_use ids per replay, unless the script fixed them, so a resumed session stays unique.
        return turn.model_copy(
            update={
                "content": [
                    b.model_copy(update={"id": f"toolu_{uuid.uuid4().hex[:24]}"})
                    if isinstance(b, ToolUseBlock) and "id" not in b.model_fields_set
                    else b
                    for b in turn.content
                ],
                "model": "scripted",
            }
        )


# --- Anthropic --------------------------------------------------------------------------------------------


class AnthropicChatProvider:
    """The Anthropic Messages API with tools. ``client`` may be injected (tests use a mocked transport)."""

    name = "anthropic"

    def __init__(
        self,
        *,
        model: str | None = None,
        max_tokens: int = 4096,
        client: Any | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        self.settings = ModelSettings(model=model, base_url=base_url, max_tokens=max_tokens, timeout_s=timeout_s,
                                      max_retries=max_retries)  # a bad value: ValueError, as every live provider
        self.model = model or os.environ.get(CHAT_MODEL_ENV) or DEFAULT_CHAT_MODEL
        self.max_tokens = max_tokens
        if client is None:
            import anthropic  # the SDK takes a while to import: only when a real client is made

            from sandforge.runtime.providers.anthropic_client import has_credentials, make_client

            if not has_credentials(api_key):
                raise ChatProviderError("no Anthropic API key", hint="set ANTHROPIC_API_KEY")
            try:
                client = make_client(api_key=api_key, timeout_s=timeout_s, max_retries=max_retries, base_url=base_url)
            except anthropic.AnthropicError as exc:
                raise ChatProviderError(
                    f"cannot create the Anthropic client: {exc}", hint="set ANTHROPIC_API_KEY"
                ) from exc
        self.client = client

    def complete(self, request: ChatRequest) -> ChatResponse:
        from sandforge.runtime.providers.anthropic_client import ERRORS
        from sandforge.runtime.providers.transport import mapped

        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": request.messages,
        }
        if request.tools:
            kwargs["tools"] = request.tools
        if request.system:
            kwargs["system"] = request.system
        with mapped(ERRORS, into=chat_error):  # one exception map for every provider
            resp = self.client.messages.create(**kwargs)
        blocks: list[TextBlock | ToolUseBlock] = []
        for block in resp.content:
            kind = getattr(block, "type", None)
            if kind == "text":
                blocks.append(TextBlock(text=block.text))
            elif kind == "tool_use":
                raw = block.input
                blocks.append(ToolUseBlock(id=block.id, name=block.name, input=raw if isinstance(raw, dict) else {}))
            # other block types (thinking, server tools) carry nothing the loop acts on
        usage = getattr(resp, "usage", None)
        return ChatResponse(
            content=blocks,
            stop_reason=resp.stop_reason,
            model=resp.model,
            usage={k: int(v) for k in ("input_tokens", "output_tokens") if (v := getattr(usage, k, None)) is not None},
        )
