"""Every live provider validates its settings through one model (``ModelSettings``) and maps its SDK's failures
through one table-driven function at one edge (``transport.mapped``): the same failure of either SDK is the
same kind, retriability and message shape, for the program providers and the chat providers alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from sandforge.runtime.providers.anthropic_client import ERRORS as ANTHROPIC
from sandforge.runtime.providers.anthropic_provider import AnthropicProvider
from sandforge.runtime.providers.chat import AnthropicChatProvider, ChatProviderError, ChatRequest
from sandforge.runtime.providers.openai_chat import OpenAIChatProvider
from sandforge.runtime.providers.openai_client import ERRORS as OPENAI
from sandforge.runtime.providers.openai_provider import OpenAIProvider
from sandforge.runtime.providers.transport import classify

LIVE: dict[str, Callable[..., Any]] = {
    "anthropic": lambda **kw: AnthropicProvider(api_key="k", **kw),
    "anthropic chat": lambda **kw: AnthropicChatProvider(api_key="k", **kw),
    "openai": lambda **kw: OpenAIProvider(api_key="k", **kw),
    "openai chat": lambda **kw: OpenAIChatProvider(api_key="k", **kw),
}
BAD = [{"max_tokens": 0}, {"timeout_s": 0}, {"timeout_s": -1.0}, {"max_retries": -1}]


@pytest.mark.parametrize("kind", LIVE)
@pytest.mark.parametrize("bad", BAD, ids=lambda b: "=".join(map(str, next(iter(b.items())))))
def test_every_live_provider_refuses_a_bad_setting_the_same_way(kind: str, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        LIVE[kind](**bad)


def test_the_chat_provider_waits_longer_by_default_and_keeps_no_key() -> None:
    chat, program = OpenAIChatProvider(api_key="sk-secret-1"), OpenAIProvider(api_key="sk-secret-1")
    assert (chat.timeout_s, program.timeout_s) == (120.0, 60.0)
    for provider in (chat, program):
        assert "sk-secret-1" not in repr(vars(provider))  # the key lives in the SDK client only


def test_one_failure_is_one_kind_whichever_sdk_raised_it() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1")
    answer = httpx.Response(429, request=request, json={"error": {"message": "slow down"}})
    pairs = [
        (anthropic.APITimeoutError(request=request), openai.APITimeoutError(request=request)),
        (anthropic.APIConnectionError(request=request), openai.APIConnectionError(request=request)),
        (anthropic.RateLimitError("x", response=answer, body={"error": {"message": "slow down"}}),
         openai.RateLimitError("x", response=answer, body={"message": "slow down"})),
    ]  # fmt: skip
    for from_anthropic, from_openai in pairs:
        a, o = classify(from_anthropic, ANTHROPIC), classify(from_openai, OPENAI)
        assert (a.kind, a.retriable) == (o.kind, o.retriable)
        assert a.message.replace("Anthropic", "X") == o.message.replace("OpenAI-compatible", "X")
    assert classify(pairs[2][0], ANTHROPIC).message == "Anthropic API error 429: slow down"


def _not_json(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=b"<html>proxy error</html>", headers={"content-type": "application/json"})


def test_a_body_that_is_not_json_is_a_typed_retriable_error_for_both_chat_providers() -> None:
    """The Anthropic chat provider let ``json.JSONDecodeError`` through; the one edge types it for both."""
    http = httpx.Client(transport=httpx.MockTransport(_not_json))
    providers = [
        AnthropicChatProvider(client=anthropic.Anthropic(api_key="k", max_retries=0, http_client=http)),
        OpenAIChatProvider(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0, http_client=http),
    ]
    for provider in providers:
        with pytest.raises(ChatProviderError, match="a body that is not JSON") as info:
            provider.complete(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
        assert info.value.retriable
