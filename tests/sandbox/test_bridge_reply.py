"""Typed seams of the exchange (issue 17 item 7): bridge replies as a model, the outcome's snapshot field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandforge.sandbox import BridgeReply, ExecutionOutcome
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.exchange import _answer, no_bridge
from sandforge.sandbox.protocol import HEADER, CallFrame, CallResultFrame, CallTarget, DeclareFrame, encode_frame

CALL = CallFrame(type="call", id=0, target=CallTarget(kind="tool", name="t"), method="m", args=[1])
DECLARE = DeclareFrame(type="declare", id=0, target=CallTarget(kind="delegate", name="w", purpose="p"))


def _body(reply: BridgeReply) -> dict[str, Any]:
    data = encode_frame(CallResultFrame(id=3, outcome=reply).wire(), 1 << 20)
    decoded: dict[str, Any] = json.loads(data[HEADER.size :])
    return decoded


def test_a_mapping_reply_becomes_a_model_and_keeps_its_value() -> None:
    value = {"rows": [1, 2, {"x": None}]}
    reply = BridgeReply.of({"status": "ok", "value": value, "unknown": 1})
    assert reply.status == "ok" and reply.value is value  # not walked: encoding is its JSON check
    assert _body(reply) == {"type": "call_result", "id": 3, "outcome": {
        "status": "ok", "value": value, "error_type": None, "error_message": None, "retriable": False}}  # fmt: skip


def test_a_value_that_is_not_json_fails_at_encoding() -> None:
    from sandforge.sandbox.protocol import ProtocolError

    with pytest.raises(ProtocolError):
        encode_frame(CallResultFrame(id=0, outcome=BridgeReply.of({"status": "ok", "value": float("nan")})).wire(), 999)


def test_calls_and_declarations_are_told_apart_once() -> None:
    class Handler:
        def __call__(self, frame: CallFrame) -> dict[str, Any]:
            return {"status": "ok", "value": frame.args}

        def declare(self, frame: DeclareFrame) -> BridgeReply:
            return BridgeReply.error("invalid_contract", f"no {frame.target.name}")

    assert _answer(Handler(), CALL) == BridgeReply(status="ok", value=[1])
    assert _answer(Handler(), DECLARE) == BridgeReply.error("invalid_contract", "no w")
    assert _answer(lambda frame: {"status": "ok"}, DECLARE) == BridgeReply(status="ok")  # no declare: acknowledged
    assert _answer(no_bridge, CALL).error_type == "nested_calls_unavailable"


def test_a_malformed_reply_is_an_error_reply() -> None:
    reply = _answer(lambda frame: {"status": "maybe"}, CALL)
    assert (reply.status, reply.error_type) == ("error", "internal_error")


def test_the_outcome_snapshot_is_a_field() -> None:
    snap = ContextSnapshot.from_dict({"a": [1]})
    out = ExecutionOutcome.succeeded(None, snap)
    assert "context_snapshot" in ExecutionOutcome.model_fields
    assert out.context_snapshot is snap and "context_snapshot" not in out.model_dump()
    built = ExecutionOutcome(status="ok", context={"a": [1]})
    assert built.context_snapshot == snap and built.context == {"a": [1]}
    with pytest.raises(ValueError, match="not both"):
        ExecutionOutcome(status="ok", context={"a": 1}, context_snapshot=snap)


@pytest.mark.parametrize(
    ("value", "error_type", "message"),
    [
        (float("nan"), "internal_error", "the host answered the nested call with a value that is not JSON"),
        ({1, 2}, "internal_error", "the host answered the nested call with a value that is not JSON"),
        ("x" * 300_000, "output_limit", "nested result too large"),
    ],
)
def test_a_reply_that_cannot_be_sent_says_why(value: Any, error_type: str, message: str) -> None:
    """On a real sandbox: a handler's value that is not JSON is the host's fault, named as such; one over the
    message limit is the output limit. Either way the program gets an error reply it can read, and runs on."""
    from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig

    def bridge(call: CallFrame) -> dict[str, Any]:
        return {"status": "ok", "value": value}

    code = "r = tool('t').m()\nreturn [r.ok, r.error_type, r.error_message]"
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code=code, limits=Limits(max_message_bytes=200_000)), bridge=bridge)
    assert out.ok, out.error_message
    assert out.value == [False, error_type, message]
