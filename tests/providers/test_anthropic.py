"""AnthropicProvider against a fake Messages API: the real SDK and HTTP client, a mocked transport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import pytest

from sandforge.runtime.providers import AnthropicProvider, GenerationRequest, InvalidProviderOutput, ProviderError
from sandforge.runtime.providers.base import AttemptFeedback
from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME, PROGRAM_TOOL_SCHEMA

Handler = Callable[[httpx.Request], httpx.Response]


def message(content: list[dict[str, Any]], stop_reason: str = "tool_use") -> dict[str, Any]:
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


def tool_use(payload: Any, name: str = PROGRAM_TOOL_NAME) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": name, "input": payload}


class FakeApi:
    """Records every request; answers each with the next queued response (or raises the queued error)."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(item, Exception):
            raise item
        return item

    def body(self, index: int = 0) -> dict[str, Any]:
        return json.loads(self.requests[index].content)  # type: ignore[no-any-return]


def provider(api: FakeApi, **kwargs: Any) -> AnthropicProvider:
    kwargs.setdefault("max_retries", 0)
    return AnthropicProvider(api_key="sk-test", http_client=httpx.Client(transport=httpx.MockTransport(api)), **kwargs)


REQUEST = GenerationRequest(
    role="calculator",
    method="add",
    args=[3],
    context_keys=["memory"],
    context_summary={"memory": "int = 2"},
    allowed_modules=["math", "statistics"],
)


def test_program_comes_from_a_forced_tool_call() -> None:
    api = FakeApi(
        httpx.Response(200, json=message([tool_use({"code": "return args[0] + 1", "dependencies": ["math"]})]))
    )
    program = provider(api, model="claude-x", max_tokens=1234).generate(REQUEST)
    assert program.code == "return args[0] + 1"
    assert program.dependencies == ["math"]
    assert program.provider == "anthropic"
    assert (program.input_tokens, program.output_tokens) == (11, 7)
    body = api.body()
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 1234
    assert body["tool_choice"] == {"type": "tool", "name": PROGRAM_TOOL_NAME}
    assert body["tools"][0]["name"] == PROGRAM_TOOL_NAME
    assert body["tools"][0]["input_schema"] == PROGRAM_TOOL_SCHEMA
    assert PROGRAM_TOOL_SCHEMA["required"] == ["code"]
    assert set(PROGRAM_TOOL_SCHEMA["properties"]) == {"code", "dependencies"}
    assert "BODY of a function" in body["system"]
    assert "math, statistics" in body["system"]
    user = body["messages"][0]["content"]
    assert '"call": "calculator.add(3)"' in user and '"memory": "int = 2"' in user
    headers = api.requests[0].headers
    assert "sk-test" in (headers.get("x-api-key", "") + headers.get("authorization", ""))


def test_feedback_reaches_the_model() -> None:
    api = FakeApi(httpx.Response(200, json=message([tool_use({"code": "return 1"})])))
    feedback = AttemptFeedback(
        kind="guardrail", attempt_number=1, remaining_budget=1, violation_type="callable_in_context",
        violation_message="a lambda is stored in context", violation_location="line 2, column 1: x",
        required_correction="store data, not functions", previous_code="context['f'] = lambda: 1",
    )  # fmt: skip
    provider(api).generate(REQUEST.model_copy(update={"feedback": [feedback], "attempt_number": 2}))
    user = api.body()["messages"][0]["content"]
    for text in ('"violation_type": "callable_in_context"', '"violation_message": "a lambda is stored in context"',
                 '"violation_location": "line 2, column 1: x"', '"required_correction": "store data, not functions"',
                 '"attempt_number": 1', '"remaining_budget": 1', '"context[\'f\'] = lambda: 1"'):  # fmt: skip
        assert text in user


def test_timeout_is_configurable_and_sent() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions.get("timeout"))
        return httpx.Response(200, json=message([tool_use({"code": "return 1"})]))

    p = AnthropicProvider(api_key="k", timeout_s=7.5, max_retries=0,
                          http_client=httpx.Client(transport=httpx.MockTransport(handler)))  # fmt: skip
    p.generate(REQUEST)
    assert seen and seen[0]["read"] == 7.5


@pytest.mark.parametrize(
    ("content", "stop", "kind"),
    [
        ([{"type": "text", "text": "here is some code: return 1"}], "end_turn", "no_tool_call"),
        ([tool_use({"code": "return 1"}, name="other_tool")], "tool_use", "no_tool_call"),
        ([tool_use({"dependencies": []})], "tool_use", "invalid_payload"),
        ([tool_use({"code": ""})], "tool_use", "invalid_payload"),
        ([tool_use({"code": 42})], "tool_use", "invalid_payload"),
        ([tool_use({"code": "return 1", "dependencies": "math"})], "tool_use", "invalid_payload"),
        ([tool_use({"code": "return 1"})], "max_tokens", "truncated"),
        ([], "max_tokens", "no_tool_call"),
    ],
)
def test_unusable_answers_are_invalid_output(content: list[dict[str, Any]], stop: str, kind: str) -> None:
    api = FakeApi(httpx.Response(200, json=message(content, stop)))
    with pytest.raises(InvalidProviderOutput) as info:
        provider(api).generate(REQUEST)
    assert info.value.kind == kind
    assert info.value.retriable


@pytest.mark.parametrize(
    ("status", "retriable", "kind"),
    [
        (429, True, "rate_limit"),
        (500, True, "server_error"),
        (529, True, "server_error"),
        (503, True, "server_error"),
        (401, False, "authentication"),
        (403, False, "authentication"),
        (400, False, "bad_request"),
        (404, False, "bad_request"),
    ],
)
def test_api_errors_become_typed_provider_errors(status: int, retriable: bool, kind: str) -> None:
    body = {"type": "error", "error": {"type": "some_error", "message": f"status {status} says no"}}
    api = FakeApi(httpx.Response(status, json=body))
    with pytest.raises(ProviderError) as info:
        provider(api).generate(REQUEST)
    err = info.value
    assert not isinstance(err, InvalidProviderOutput)
    assert err.error_type == "provider"
    assert (err.retriable, err.kind) == (retriable, kind)
    assert f"status {status} says no" in err.message
    assert "sk-test" not in err.message


def test_transport_timeout_is_retriable() -> None:
    api = FakeApi(httpx.ReadTimeout("read timed out"))
    with pytest.raises(ProviderError) as info:
        provider(api).generate(REQUEST)
    assert (info.value.retriable, info.value.kind) == (True, "timeout")


def test_connection_error_is_retriable() -> None:
    api = FakeApi(httpx.ConnectError("connection refused"))
    with pytest.raises(ProviderError) as info:
        provider(api).generate(REQUEST)
    assert (info.value.retriable, info.value.kind) == (True, "connection")


def test_sdk_retries_happen_before_the_error_is_typed() -> None:
    ok = httpx.Response(200, json=message([tool_use({"code": "return 2"})]))
    overloaded = httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
                                headers={"retry-after-ms": "1"})  # fmt: skip
    api = FakeApi(overloaded, ok)
    program = provider(api, max_retries=1).generate(REQUEST)
    assert program.code == "return 2"
    assert len(api.requests) == 2


def test_invalid_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        AnthropicProvider(api_key="k", max_tokens=0)
    with pytest.raises(ValueError):
        AnthropicProvider(api_key="k", timeout_s=0)


def test_model_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_ANTHROPIC_MODEL", "claude-from-env")
    api = FakeApi(httpx.Response(200, json=message([tool_use({"code": "return 1"})])))
    provider(api).generate(REQUEST)
    assert api.body()["model"] == "claude-from-env"


def test_missing_credentials_is_a_non_retriable_provider_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "none"))
    api = FakeApi(httpx.Response(200, json=message([tool_use({"code": "return 1"})])))
    p = AnthropicProvider(max_retries=0, http_client=httpx.Client(transport=httpx.MockTransport(api)))
    with pytest.raises(ProviderError) as info:
        p.generate(REQUEST)
    assert (info.value.retriable, info.value.kind) == (False, "credentials")
    assert api.requests == []


def test_unloadable_credentials_profile_is_a_provider_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("ANTHROPIC_PROFILE", "missing")
    p = AnthropicProvider(max_retries=0)
    with pytest.raises(ProviderError) as info:
        p.generate(REQUEST)
    assert (info.value.retriable, info.value.kind) == (False, "credentials")
