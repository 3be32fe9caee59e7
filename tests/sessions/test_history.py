"""Rebuilding the model transcript from persisted history, including damaged history."""

from __future__ import annotations

from sandforge.runtime.sessions import Message, MessageType, ToolStatus, to_api_messages

S = "s"


def _call(call_id: str, name: str = "t", tool_input: str | None = "{}") -> Message:
    return Message(
        session_id=S,
        type=MessageType.TOOL_CALL,
        tool_name=name,
        tool_call_id=call_id,
        tool_input=tool_input,
        tool_status=ToolStatus.SUCCESS,
    )


def _result(call_id: str, content: str = "r", status: ToolStatus = ToolStatus.SUCCESS) -> Message:
    return Message.tool_result(S, name="t", call_id=call_id, content=content, status=status)


def test_one_response_folds_into_one_assistant_message() -> None:
    api = to_api_messages(
        [
            Message.user(S, "q"),
            Message.assistant(S, "thinking"),
            _call("a"),
            _call("b"),
            _result("a"),
            _result("b", status=ToolStatus.ERROR),
            Message.assistant(S, "done"),
        ]
    )
    assert [m["role"] for m in api] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in api[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert [(b["tool_use_id"], b["is_error"]) for b in api[2]["content"]] == [("a", False), ("b", True)]


def test_missing_result_gets_a_synthetic_error() -> None:
    api = to_api_messages([Message.user(S, "q"), _call("a"), Message.user(S, "next question")])
    assert api[2]["role"] == "user"
    first, second = api[2]["content"]
    assert first["type"] == "tool_result" and first["tool_use_id"] == "a" and first["is_error"]
    assert second == {"type": "text", "text": "next question"}


def test_missing_result_at_the_end_and_between_assistant_messages() -> None:
    api = to_api_messages([Message.user(S, "q"), _call("a"), Message.assistant(S, "later"), _call("b")])
    assert [m["role"] for m in api] == ["user", "assistant", "user"]
    # the assistant text after the call folds into the same assistant message (no user turn in between)
    assert [b["tool_use_id"] for b in api[2]["content"]] == ["a", "b"]


def test_orphan_results_are_dropped_and_inputs_sanitized() -> None:
    api = to_api_messages(
        [
            _result("ghost"),
            Message.user(S, "q"),
            _call("a", tool_input="{broken"),
            _call("b", tool_input="[1]"),
            _result("a"),
            _result("zzz"),
            _result("b"),
        ]
    )
    assert api[0] == {"role": "user", "content": [{"type": "text", "text": "q"}]}
    assert [b["input"] for b in api[1]["content"]] == [{}, {}]
    assert [b["tool_use_id"] for b in api[2]["content"]] == ["a", "b"]


def test_transcript_starts_with_a_user_message_and_merges_users() -> None:
    api = to_api_messages(
        [Message.assistant(S, "stray"), Message.user(S, "one"), Message.user(S, "two"), Message.assistant(S, "")]
    )
    assert api == [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]


def test_empty_history() -> None:
    assert to_api_messages([]) == []
