"""Chat providers: the scripted one (script formats, recording) and Anthropic on a mocked HTTP transport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest

from sandforge.runtime.errors import UsageError
from sandforge.runtime.sessions import (
    AnthropicChatProvider,
    ChatProviderError,
    ChatRequest,
    ScriptedChatProvider,
    ScriptExhaustedError,
    SessionStore,
    TextBlock,
    ToolStatus,
    ToolUseBlock,
)
from tests.sessions.helpers import CORE, make_session

REQUEST = ChatRequest(
    system="be brief",
    messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    tools=[{"name": "load_tool_group", "description": "d", "input_schema": {"type": "object", "properties": {}}}],
    max_tokens=100,
)


# --- scripted ---------------------------------------------------------------------------------------------


def test_scripted_turn_formats_and_recording() -> None:
    provider = ScriptedChatProvider(
        [
            "plain text",
            {"text": "let me look", "tool_calls": [{"name": "gmail_search", "input": {"query": "x"}}]},
            {"content": [{"type": "tool_use", "id": "toolu_fixed", "name": "t", "input": {}}], "stop_reason": "x"},
        ]
    )
    first = provider.complete(REQUEST)
    assert first.content == [TextBlock(text="plain text")] and first.stop_reason == "end_turn"
    second = provider.complete(REQUEST)
    assert second.text == "let me look" and second.stop_reason == "tool_use"
    assert [(u.name, u.input) for u in second.tool_uses] == [("gmail_search", {"query": "x"})]
    third = provider.complete(REQUEST)
    assert third.tool_uses[0].id == "toolu_fixed" and third.stop_reason == "x"
    assert len(provider.requests) == 3 and provider.requests[0].tool_names == ["load_tool_group"]
    with pytest.raises(ScriptExhaustedError):
        provider.complete(REQUEST)
    assert len(provider.requests) == 4  # the failed request is recorded too


def test_scripted_tool_use_ids_are_fresh_per_replay() -> None:
    turn = {"tool_calls": [{"name": "t", "input": {}}]}
    provider = ScriptedChatProvider([turn, turn])
    ids = {provider.complete(REQUEST).tool_uses[0].id for _ in range(2)}
    assert len(ids) == 2


def test_scripted_requests_are_snapshots() -> None:
    provider = ScriptedChatProvider(["a"])
    request = REQUEST.model_copy(deep=True)
    provider.complete(request)
    request.messages.append({"role": "assistant", "content": []})
    assert len(provider.requests[0].messages) == 1


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", json.dumps({"turns": ["hi", {"tool_calls": [{"name": "t"}]}]})),
        (".yaml", "- hi\n- tool_calls:\n    - name: t\n"),
    ],
)
def test_script_files(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"script{suffix}"
    path.write_text(text)
    provider = ScriptedChatProvider.from_file(path)
    assert provider.remaining == 2
    assert provider.turns[1].tool_uses[0].name == "t"


@pytest.mark.parametrize(
    "text", ["{not json", '{"no_turns": []}', '[{"bogus": 1}]', '[{"content": [{"type": "image"}]}]', "[3]"]
)
def test_bad_scripts_are_usage_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(UsageError):
        ScriptedChatProvider.from_file(path)


def test_missing_script_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read script"):
        ScriptedChatProvider.from_file(tmp_path / "nope.json")


# --- Anthropic on a mocked transport ----------------------------------------------------------------------


def _client(handler: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test-key", max_retries=0, http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )


def _message(content: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


def test_anthropic_request_and_response_mapping() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/messages"
        assert "test-key" in (request.headers.get("x-api-key", "") + request.headers.get("authorization", ""))
        seen.append(json.loads(request.content))
        return httpx.Response(
            200,
            json=_message(
                [
                    {"type": "text", "text": "Loading."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "load_tool_group",
                        "input": {"group_name": "google_gmail"},
                    },
                ],
                "tool_use",
            ),
        )

    provider = AnthropicChatProvider(model="claude-test", client=_client(handler))
    response = provider.complete(REQUEST)
    body = seen[0]
    assert body["model"] == "claude-test" and body["max_tokens"] == 100 and body["system"] == "be brief"
    assert body["tools"] == REQUEST.tools and body["messages"] == REQUEST.messages
    assert response.text == "Loading."
    assert response.tool_uses == [
        ToolUseBlock(id="toolu_1", name="load_tool_group", input={"group_name": "google_gmail"})
    ]
    assert response.stop_reason == "tool_use" and response.model == "claude-test"
    assert response.usage == {"input_tokens": 11, "output_tokens": 7}


@pytest.mark.parametrize(("status", "retriable"), [(429, True), (529, True), (500, True), (400, False), (401, False)])
def test_anthropic_api_errors_are_typed(status: int, retriable: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"type": "error", "error": {"type": "x", "message": "nope here"}})

    provider = AnthropicChatProvider(client=_client(handler))
    with pytest.raises(ChatProviderError, match=f"Anthropic API error {status}: nope here") as exc:
        provider.complete(REQUEST)
    assert exc.value.retriable is retriable


def test_anthropic_connection_error_is_retriable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route to host", request=request)

    provider = AnthropicChatProvider(client=_client(handler))
    with pytest.raises(ChatProviderError, match="cannot reach") as exc:
        provider.complete(REQUEST)
    assert exc.value.retriable


def test_anthropic_without_api_key_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ChatProviderError, match="no Anthropic API key") as exc:
        AnthropicChatProvider()
    assert exc.value.hint == "set ANTHROPIC_API_KEY"


def test_session_loop_over_the_anthropic_provider(session_store: SessionStore) -> None:
    """The whole loop on the real provider class: load a group, use it, answer; tools grow between calls."""
    replies = [
        _message(
            [{"type": "tool_use", "id": "toolu_a", "name": "load_tool_group", "input": {"group_name": "google_gmail"}}],
            "tool_use",
        ),
        _message([{"type": "tool_use", "id": "toolu_b", "name": "gmail_search", "input": {"query": "x"}}], "tool_use"),
        _message([{"type": "text", "text": "Nothing new."}]),
    ]
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=replies[len(bodies) - 1])

    session, _ = make_session(session_store, [])
    session.provider = AnthropicChatProvider(client=_client(handler))
    result = session.send("anything new?")
    assert result.text == "Nothing new." and result.model_calls == 3
    assert [c.status for c in result.tool_calls] == [ToolStatus.SUCCESS, ToolStatus.SUCCESS]
    assert [t["name"] for t in bodies[0]["tools"]] == CORE
    assert [t["name"] for t in bodies[1]["tools"]] == [*CORE, "gmail_search", "gmail_trash"]
    last = bodies[2]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[-1]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_b",
        "content": "gmail_search ok",
        "is_error": False,
    }
