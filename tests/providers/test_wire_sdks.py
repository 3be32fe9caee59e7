"""Both program providers through their official SDKs (``anthropic``, ``openai``) against a model API on loopback.

No mock of an SDK or of its HTTP client: each request leaves the SDK over a real socket to ``tests/providers/
wire.py``, which answers as the provider's public API reference shows (successes, errors, 429 with
``Retry-After``, malformed bodies, a held response for timeouts). The last tests run an Agent on such a
provider: each typed provider error reaches the lifecycle as its lane.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent import Agent, CallLog, Workspace
from sandforge.runtime.providers import GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.anthropic_provider import AnthropicProvider
from sandforge.runtime.providers.openai_provider import OpenAIProvider
from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME, PROGRAM_TOOL_SCHEMA, render_prompt
from sandforge.sandbox import SandboxConfig
from tests.providers.wire import (
    Reply,
    WireServer,
    anthropic_error,
    completion,
    function_call,
    message,
    openai_error,
    program_completion,
    program_message,
    wire_server,
)

KEY = "sk-wire-test-0123456789abcdef"
REQUEST = GenerationRequest(
    role="calculator", method="add", args=[3], context_keys=["memory"], context_summary={"memory": "int = 2"},
    allowed_modules=["math"],
)  # fmt: skip


@pytest.fixture
def server() -> Iterator[WireServer]:
    with wire_server() as s:
        yield s


def openai_provider(server: WireServer, **kwargs: Any) -> OpenAIProvider:
    kwargs.setdefault("max_retries", 0)
    return OpenAIProvider(base_url=f"{server.url}/v1", api_key=KEY, model="gpt-test", **kwargs)


def anthropic_provider(server: WireServer, **kwargs: Any) -> AnthropicProvider:
    kwargs.setdefault("max_retries", 0)
    return AnthropicProvider(base_url=server.url, api_key=KEY, model="claude-test", **kwargs)


#: Per provider: how to build it, a program answer, and an error answer of its API.
WIRES: dict[str, tuple[Callable[..., Any], Callable[[str], dict[str, Any]], Callable[[int, str, str], Reply]]] = {
    "openai": (openai_provider, program_completion, lambda s, m, k: openai_error(s, m, k)),
    "anthropic": (anthropic_provider, program_message, anthropic_error),
}


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], Callable[[str], dict[str, Any]], Any]:
    return WIRES[request.param]


# --- the request and the answer ---------------------------------------------------------------------------


def test_openai_program_comes_from_a_forced_function_call(server: WireServer) -> None:
    server.queue(Reply(body=program_completion("return args[0] + 1")))
    program = openai_provider(server, max_tokens=321, temperature=0.2).generate(REQUEST)
    assert (program.code, program.provider, program.model) == ("return args[0] + 1", "openai", "gpt-test")
    assert (program.input_tokens, program.output_tokens) == (19, 10)  # usage.prompt_tokens / completion_tokens
    (seen,) = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    body = seen.body
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("gpt-test", 321, 0.2)
    assert body["tool_choice"] == {"type": "function", "function": {"name": PROGRAM_TOOL_NAME}}
    assert body["tools"][0]["function"]["parameters"] == PROGRAM_TOOL_SCHEMA


def test_one_prompt_builder_two_transports(server: WireServer) -> None:
    """Both transports send render_prompt's two texts, verbatim: no prompt text is the transport's own."""
    server.queue(Reply(body=program_completion("return 1")))
    openai_provider(server).generate(REQUEST)
    server.queue(Reply(body=program_message("return 1")))
    anthropic_provider(server).generate(REQUEST)
    prompt = render_prompt(REQUEST)
    via_openai, via_anthropic = (r.body for r in server.requests)
    assert via_openai["messages"] == [{"role": "system", "content": prompt.system},
                                      {"role": "user", "content": prompt.user}]  # fmt: skip
    assert (via_anthropic["system"], via_anthropic["messages"][0]["content"]) == (prompt.system, prompt.user)
    assert via_openai["tools"][0]["function"]["description"] == via_anthropic["tools"][0]["description"]


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (completion(content="Here is the code: return 1"), "no_tool_call"),
        (completion(tool_calls=[function_call("other_tool", {"code": "return 1"})]), "no_tool_call"),
        (completion(tool_calls=[function_call(PROGRAM_TOOL_NAME, "{not json")]), "invalid_payload"),
        (completion(tool_calls=[function_call(PROGRAM_TOOL_NAME, {"code": ""})]), "invalid_payload"),
        (completion(tool_calls=[function_call(PROGRAM_TOOL_NAME, {"code": "x", "dependencies": [1]})]),
         "invalid_payload"),
        (completion(tool_calls=[function_call(PROGRAM_TOOL_NAME, {"code": "return 1"})], finish_reason="length"),
         "truncated"),
        ({**completion(content="x"), "choices": []}, "invalid_payload"),
    ],
)  # fmt: skip
def test_openai_unusable_answers_are_invalid_output(server: WireServer, reply: dict[str, Any], kind: str) -> None:
    server.queue(Reply(body=reply))
    with pytest.raises(InvalidProviderOutput) as info:
        openai_provider(server).generate(REQUEST)
    assert info.value.kind == kind


def test_anthropic_unusable_answer_is_invalid_output(server: WireServer) -> None:
    server.queue(Reply(body=message([{"type": "text", "text": "return 1"}], stop_reason="end_turn")))
    with pytest.raises(InvalidProviderOutput) as info:
        anthropic_provider(server).generate(REQUEST)
    assert info.value.kind == "no_tool_call"


# --- errors, retries, timeouts (both providers) -----------------------------------------------------------


def test_429_is_retried_after_the_servers_retry_after(server: WireServer, wire: Any) -> None:
    """The SDK's own retry (max_retries) honours Retry-After: its backoff alone would wait at most 0.5 s before
    the first retry, so a gap of a full second shows the header was read (a lower bound, never a speed goal)."""
    make, answer, error = wire
    limited = error(429, "Rate limit reached for requests", "rate_limit_error")
    limited.headers["retry-after"] = "1"
    server.queue(limited, Reply(body=answer("return 7")))
    program = make(server, max_retries=2).generate(REQUEST)
    assert program.code == "return 7"
    first, second = server.requests
    assert second.at - first.at >= 1.0


@pytest.mark.parametrize(
    ("status", "kind", "retriable"),
    [(401, "authentication", False), (403, "authentication", False), (400, "bad_request", False),
     (404, "bad_request", False), (429, "rate_limit", True), (500, "server_error", True),
     (503, "server_error", True), (529, "server_error", True)],
)  # fmt: skip
def test_status_errors_are_typed(server: WireServer, wire: Any, status: int, kind: str, retriable: bool) -> None:
    make, _, error = wire
    reply = error(status, "the server says no", "some_error")
    reply.headers["x-should-retry"] = "false"  # one request: the lane is the point here, the retry is tested above
    server.queue(reply)
    with pytest.raises(ProviderError) as info:
        make(server, max_retries=2).generate(REQUEST)
    exc = info.value
    assert not isinstance(exc, InvalidProviderOutput)
    assert (exc.kind, exc.retriable) == (kind, retriable)
    assert f"error {status}: the server says no" in exc.message and KEY not in exc.message
    assert len(server.requests) == 1


def test_server_errors_are_retried_then_answered(server: WireServer, wire: Any) -> None:
    make, answer, error = wire
    server.queue(error(500, "boom", "api_error"), error(503, "busy", "overloaded_error"),
                 Reply(body=answer("return 2")))  # fmt: skip
    assert make(server, max_retries=2).generate(REQUEST).code == "return 2"
    assert len(server.requests) == 3


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b'{"choices": ', b"[1, 2]"])
def test_malformed_bodies_are_invalid_output(server: WireServer, wire: Any, body: bytes) -> None:
    make, _, _ = wire
    server.queue(Reply(body=body))
    with pytest.raises(ProviderError) as info:
        make(server).generate(REQUEST)
    assert isinstance(info.value, InvalidProviderOutput), info.value
    assert KEY not in info.value.message


def test_a_held_response_times_out_as_a_retriable_error(server: WireServer, wire: Any) -> None:
    make, answer, _ = wire
    server.queue(Reply(body=answer("return 1"), hold=True))
    with pytest.raises(ProviderError) as info:
        make(server, timeout_s=0.5).generate(REQUEST)
    server.release.set()
    assert (info.value.kind, info.value.retriable) == ("timeout", True)


def test_an_unreachable_endpoint_is_a_connection_error(wire: Any) -> None:
    make, _, _ = wire
    with socket.socket() as probe:  # a loopback port nobody listens on once this socket is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = WireServer.__new__(WireServer)
    closed.port = port
    with pytest.raises(ProviderError) as info:
        make(closed).generate(REQUEST)
    assert (info.value.kind, info.value.retriable) == ("connection", True)


def test_openai_key_from_the_environment(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORGE_OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-openai-env")
    server.queue(Reply(body=program_completion("return 1")))
    OpenAIProvider(base_url=f"{server.url}/v1", max_retries=0).generate(REQUEST)
    monkeypatch.setenv("SANDFORGE_OPENAI_API_KEY", "sk-from-sandforge-env")  # sandforge's own variable wins
    OpenAIProvider(base_url=f"{server.url}/v1", max_retries=0).generate(REQUEST)
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer sk-from-openai-env",
                                                                     "Bearer sk-from-sandforge-env"]  # fmt: skip


def test_openai_without_a_key_is_a_credentials_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SANDFORGE_OPENAI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProviderError) as info:
        OpenAIProvider(base_url="http://127.0.0.1:9/v1").generate(REQUEST)
    assert (info.value.kind, info.value.retriable) == ("credentials", False)
    assert "OPENAI_API_KEY" in info.value.message


# --- each typed error reaches the lifecycle as its lane ---------------------------------------------------


@pytest.fixture
def workspace_on(tmp_path: Path) -> Iterator[Callable[[Any], Workspace]]:
    made: list[Workspace] = []

    def make(provider: Any) -> Workspace:
        ws = Workspace(provider=provider, sandbox=SandboxConfig(backend="subprocess", pool_size=0),
                       log=CallLog(tmp_path / "calls.jsonl"))  # fmt: skip
        made.append(ws)
        return ws

    yield make
    for ws in made:
        ws.close()


@pytest.mark.parametrize(
    ("status", "error_kind", "retriable"), [(401, "authentication", False), (429, "rate_limit", True),
                                             (500, "server_error", True)],
)  # fmt: skip
def test_api_errors_reach_the_lifecycle_as_the_provider_lane(
    server: WireServer, wire: Any, workspace_on: Callable[[Any], Workspace], status: int, error_kind: str,
    retriable: bool,
) -> None:  # fmt: skip
    make, _, error = wire
    server.queue(error(status, "no", "some_error"))
    ws = workspace_on(make(server))
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert (out.error_type, out.retriable) == ("provider", retriable)
    assert out.metadata["provider_error_kind"] == error_kind
    assert len(server.requests) == 1  # extrinsic: never regenerated
    (record,) = ws.log.records
    assert (record.error_type, record.provider_calls, record.generation_retry_attempts) == ("provider", 1, 0)


def test_unusable_answers_reach_the_generation_lane_then_a_program_runs(
    server: WireServer, workspace_on: Callable[[Any], Workspace]
) -> None:
    server.queue(Reply(body=completion(content="I would add one.")), Reply(body=b"<html>oops</html>"),
                 Reply(body=program_completion("return args[0] + 1")))  # fmt: skip
    ws = workspace_on(openai_provider(server))
    out = Agent.for_role("calc", workspace=ws).add(1)
    assert out.ok and out.value == 2, out
    (record,) = ws.log.records
    assert record.generation_retry_attempts == 2 and record.provider == "openai"
    assert [f.stage for f in record.attempt_failures] == ["generation", "generation"]
    feedback = server.requests[1].body["messages"][1]["content"]
    assert "did not produce a usable program" in feedback  # the repair feedback of the one prompt builder


# --- the chat providers, through the same SDKs ------------------------------------------------------------


def chat_providers(server: WireServer) -> dict[str, Any]:
    from sandforge.runtime.providers.chat import AnthropicChatProvider
    from sandforge.runtime.providers.openai_chat import OpenAIChatProvider

    return {
        "anthropic": AnthropicChatProvider(api_key=KEY, base_url=server.url, max_retries=0, model="claude-test"),
        "openai": OpenAIChatProvider(api_key=KEY, base_url=f"{server.url}/v1", max_retries=0, model="gpt-test"),
    }


@pytest.mark.parametrize("name", ["anthropic", "openai"])
def test_chat_providers_read_text_and_tool_calls(server: WireServer, name: str) -> None:
    from sandforge.runtime.providers.chat import ChatRequest

    if name == "openai":
        server.queue(Reply(body=completion(content="Loading.", tool_calls=[function_call("load", {"g": "calc"})])))
    else:
        server.queue(Reply(body=message([{"type": "text", "text": "Loading."},
                                         {"type": "tool_use", "id": "call_abc123", "name": "load",
                                          "input": {"g": "calc"}}])))  # fmt: skip
    tools = [{"name": "load", "description": "Load a group.", "input_schema": {"type": "object"}}]
    answer = chat_providers(server)[name].complete(
        ChatRequest(system="be brief", messages=[{"role": "user", "content": "hi"}], tools=tools)
    )
    assert (answer.text, answer.stop_reason) == ("Loading.", "tool_use")
    assert [(u.id, u.name, u.input) for u in answer.tool_uses] == [("call_abc123", "load", {"g": "calc"})]
    assert answer.usage["input_tokens"] > 0 and answer.usage["output_tokens"] > 0


@pytest.mark.parametrize("name", ["anthropic", "openai"])
def test_chat_provider_errors_are_session_errors(server: WireServer, name: str) -> None:
    from sandforge.runtime.providers.chat import ChatProviderError, ChatRequest

    server.queue(openai_error(429, "slow down", "requests") if name == "openai"
                 else anthropic_error(429, "slow down", "rate_limit_error"))  # fmt: skip
    with pytest.raises(ChatProviderError) as info:
        chat_providers(server)[name].complete(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
    assert info.value.retriable and "429: slow down" in info.value.message and KEY not in info.value.message
