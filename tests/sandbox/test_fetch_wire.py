"""The fetch frame and its reply on the host's side (issue 18), driven with scripted workers: the ordering and
flood rules nested calls obey, forged and oversized frames, what a handler's reply becomes on the wire, and
the forged-kind check (a program may end with a fetch error's kind only if the host answered with it).

End to end on every backend, with a real broker and loopback servers: ``tests/egress/test_sandbox_fetch.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.channel import Stream
from sandforge.sandbox.exchange import EgressHandler, ExitInfo, build_outcome, run_exchange
from sandforge.sandbox.protocol import HEADER, CallFrame, FrameReader
from tests.sandbox.test_host_channel import ScriptedIO, attack, escaped, frame

__all__ = ["escaped"]  # the escaped-runner fixture, shared with test_host_channel

LIMITS = Limits(timeout_s=4, memory_mb=256, disk_mb=4, max_output_bytes=8192, max_message_bytes=256 * 1024)
FETCH = {"type": "fetch", "request": {"method": "GET", "url": "https://news.example.com/rss", "headers": {}}}
OK = {"type": "result", "status": "ok", "value": 1}


def denied_reply() -> bytes:
    return json.dumps({"error": {"kind": "egress_denied", "message": "no allow entry", "reason": "no_rule"}}).encode()


def response_reply(body: bytes, status: int = 200) -> bytes:
    response = {"status": status, "headers": {"content-type": "text/xml"}, "url": "https://news.example.com/rss",
                "body_b64": base64.b64encode(body).decode(), "elapsed_ms": 1.5}  # fmt: skip
    return json.dumps({"response": response}).encode()


class Handler:
    """A bridge handler whose ``egress`` answers with canned replies and records what it was asked."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[dict[str, Any], float]] = []

    def __call__(self, call: CallFrame) -> dict[str, Any]:
        return {"status": "ok"}

    def egress(self, request: bytes, deadline: float) -> bytes:
        self.requests.append((json.loads(request), deadline))
        return self.replies.pop(0)


class PartsHandler(Handler):
    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        reply = json.loads(self.egress(request, deadline))
        if "response" not in reply:
            return json.dumps(reply).encode(), None
        body = base64.b64decode(reply["response"]["body_b64"])
        reply["response"]["body_b64"] = ""
        return json.dumps(reply).encode(), body


class ReceiptIO(ScriptedIO):
    """A scripted worker whose chunks may be made from what the host sent so far (a fetch echoing the
    receipt of the reply it read: `echoing`)."""

    def __init__(self, *chunks: bytes | Callable[[ScriptedIO], bytes], unread: int = 0) -> None:
        super().__init__(unread=unread)
        self.pending = [("result", c) for c in chunks] + self.pending  # type: ignore[assignment]

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        polled = super().poll(timeout)
        return [(stream, chunk(self) if callable(chunk) else chunk) for stream, chunk in polled]


def last_receipt(io: ScriptedIO) -> str | None:
    """The receipt of the last ``fetch_result`` the host sent."""
    headers = [json.loads(body) for body in FrameReader(1 << 30).feed(bytes(io.sent)) if body[:1] == b"{"]
    return next((h.get("receipt") for h in reversed(headers) if h.get("type") == "fetch_result"), None)


def echoing(fetch_id: int) -> Callable[[ScriptedIO], bytes]:
    """A fetch frame carrying the receipt of the reply before it, as a runner that read it sends."""
    return lambda io: frame({**FETCH, "id": fetch_id, "receipt": last_receipt(io)})


def run(
    *chunks: bytes | Callable[[ScriptedIO], bytes], handler: Any, unread: int = 0, limits: Limits = LIMITS
) -> tuple[ExecutionOutcome, ScriptedIO]:
    io = ReceiptIO(*chunks, unread=unread)
    ex = run_exchange(io, ExecutionRequest(code="return 1", limits=limits), handler)
    out = build_outcome(ex, ExitInfo(exit_code=0), backend="test", protections={}, limits=limits)
    return out, io


def replies(io: ScriptedIO) -> list[bytes]:
    """The frames the host sent after the execute frame and its context."""
    frames = FrameReader(1 << 30).feed(bytes(io.sent))
    return frames[1:]


def test_a_handler_is_an_egress_handler_by_its_method() -> None:
    assert isinstance(Handler(), EgressHandler)
    assert not isinstance(lambda call: {"status": "ok"}, EgressHandler)


@pytest.mark.parametrize("kind", [Handler, PartsHandler])
def test_a_response_is_a_header_frame_then_the_raw_body(kind: type[Handler]) -> None:
    body = bytes(range(256)) * 300  # binary, larger than one coalesced write
    handler = kind(response_reply(body, status=503))
    out, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=handler)
    assert out.ok and out.metadata["fetches"] == 1
    header, raw = replies(io)
    receipt = json.loads(header).pop("receipt")
    assert isinstance(receipt, str) and len(receipt) == 16
    assert {**json.loads(header), "receipt": None} == {
        "type": "fetch_result", "id": 0, "receipt": None,
        "response": {"status": 503, "headers": {"content-type": "text/xml"}, "url": "https://news.example.com/rss",
                     "elapsed_ms": 1.5, "body_bytes": len(body)},
    }  # fmt: skip
    assert raw == body
    [(request, deadline)] = handler.requests
    assert request == FETCH["request"] and deadline > 0


def test_an_error_reply_has_no_body_frame() -> None:
    out, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=Handler(denied_reply()))
    assert out.ok
    [header] = replies(io)
    assert json.loads(header)["error"] == {"kind": "egress_denied", "message": "no allow entry", "reason": "no_rule"}


def test_without_an_egress_handler_every_fetch_is_denied() -> None:
    for handler in (None, lambda call: {"status": "ok"}):
        _, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=handler)
        [header] = replies(io)
        error = json.loads(header)["error"]
        assert error["kind"] == "egress_denied" and "grant http_fetch" in error["message"]


@pytest.mark.parametrize(
    "reply",
    [b"not json", b'{"response": null, "error": null}', b'{"error": {"kind": "timeout", "message": "x"}}',
     json.dumps({"response": {"status": 200, "headers": {}, "url": "u", "body_b64": "***"}}).encode()],
    ids=["not JSON", "neither", "an unknown kind", "a body that is not base64"],
)  # fmt: skip
def test_a_malformed_handler_reply_is_a_network_error_for_the_program(reply: bytes) -> None:
    _, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=Handler(reply))
    [header] = replies(io)
    assert json.loads(header)["error"]["kind"] == "network_error"


def test_a_body_over_the_message_limit_is_an_egress_limit() -> None:
    too_large = Handler(response_reply(b"x" * LIMITS.max_message_bytes))
    _, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=too_large)
    [header] = replies(io)
    error = json.loads(header)["error"]
    assert error["kind"] == "egress_limit" and "message limit" in error["message"]


# --- ordering and flooding: the rules of nested calls ------------------------------------------------------


def test_a_fetch_followed_by_anything_before_its_reply_is_a_violation() -> None:
    handler = Handler(denied_reply(), denied_reply())
    out, _ = run(frame({**FETCH, "id": 0}) + frame({**FETCH, "id": 1}), handler=handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "before reading its reply" in (out.error_message or "")
    assert handler.requests == []  # nothing was fetched for a flooding sandbox


def test_a_fetch_while_the_previous_reply_is_unread_is_a_violation() -> None:
    handler = Handler(denied_reply())
    out, _ = run(frame({**FETCH, "id": 0}), handler=handler, unread=12)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "was read" in (out.error_message or "")
    assert handler.requests == []


@pytest.mark.parametrize("ids", [[1], [0, 0], [0, 2]])
def test_fetch_ids_out_of_order_are_a_violation(ids: list[int]) -> None:
    chunks = [frame({**FETCH, "id": i}) for i in ids]
    out, _ = run(*chunks, handler=Handler(*[denied_reply()] * len(ids)))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "out of order" in (out.error_message or "")


def test_fetches_and_calls_are_numbered_apart() -> None:
    call = {"type": "call", "id": 0, "target": {"kind": "tool", "name": "t"}, "method": "m", "args": [], "kwargs": {}}
    handler = Handler(denied_reply(), denied_reply())
    out, _ = run(frame({**FETCH, "id": 0}), frame(call), echoing(1), frame(OK), handler=handler)
    assert out.ok and out.metadata["fetches"] == 2 and out.metadata["nested_calls"] == 1


# --- the receipt: each fetch after the first echoes the previous reply's, so only a runner that read it can --


def test_each_reply_carries_a_new_receipt_that_the_next_fetch_echoes() -> None:
    handler = Handler(*[denied_reply()] * 3)
    out, io = run(frame({**FETCH, "id": 0}), echoing(1), echoing(2), frame(OK), handler=handler)
    assert out.ok and len(handler.requests) == 3
    receipts = [json.loads(header)["receipt"] for header in replies(io)]
    assert len(set(receipts)) == 3


@pytest.mark.parametrize(
    "second",
    [{**FETCH, "id": 1}, {**FETCH, "id": 1, "receipt": "0" * 16}, {**FETCH, "id": 1, "receipt": None}],
    ids=["none", "a guess", "null"],
)
def test_a_fetch_without_the_previous_receipt_is_a_violation_and_is_not_served(second: dict[str, Any]) -> None:
    handler = Handler(denied_reply(), denied_reply())
    out, _ = run(frame({**FETCH, "id": 0}), frame(second), frame(OK), handler=handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "receipt" in (out.error_message or "")
    assert len(handler.requests) == 1


def test_a_first_fetch_claiming_a_receipt_is_a_violation() -> None:
    handler = Handler(denied_reply())
    out, _ = run(frame({**FETCH, "id": 0, "receipt": "abc"}), frame(OK), handler=handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and handler.requests == []


@pytest.mark.parametrize(
    "forged",
    [{**FETCH, "id": 0, "extra": 1}, {"type": "fetch", "id": 0, "request": []}, {"type": "fetch", "id": -1,
     "request": {}}, {"type": "fetch_result", "id": 0, "error": {}}],
    ids=["an extra field", "a request that is not an object", "a negative id", "a host frame"],
)  # fmt: skip
def test_forged_fetch_frames_are_violations(forged: dict[str, Any]) -> None:
    handler = Handler(denied_reply())
    out, _ = run(frame(forged), handler=handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION
    assert handler.requests == []


def test_an_oversized_fetch_frame_is_refused_before_it_is_read() -> None:
    handler = Handler(denied_reply())
    out, _ = run(HEADER.pack(LIMITS.max_message_bytes + 1) + b"{", handler=handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "limit" in (out.error_message or "")
    assert handler.requests == []


# --- the forged-kind check ---------------------------------------------------------------------------------


def error_result(kind: str) -> dict[str, Any]:
    return {"type": "result", "status": "error",
            "error": {"type": kind, "message": f"EgressDenied: {kind}", "exception": "EgressDenied"}}  # fmt: skip


def test_a_fetch_error_kind_the_host_never_answered_is_an_execution_error() -> None:
    out, _ = run(frame(error_result("egress_denied")), handler=Handler())
    assert out.error_type == ErrorType.EXECUTION and "no fetch of this execution failed so" in (out.error_message or "")
    assert out.retriable is False


def test_a_fetch_error_kind_the_host_answered_is_the_outcome() -> None:
    out, _ = run(frame({**FETCH, "id": 0}), frame(error_result("egress_denied")), handler=Handler(denied_reply()))
    assert out.error_type == ErrorType.EGRESS_DENIED and out.retriable is False
    network = json.dumps({"error": {"kind": "network_error", "message": "refused", "reason": "connect"}}).encode()
    out, _ = run(frame({**FETCH, "id": 0}), frame(error_result("network_error")), handler=Handler(network))
    assert out.error_type == ErrorType.NETWORK_ERROR and out.retriable is True


def test_another_kind_than_the_one_answered_is_forged() -> None:
    out, _ = run(frame({**FETCH, "id": 0}), frame(error_result("network_error")), handler=Handler(denied_reply()))
    assert out.error_type == ErrorType.EXECUTION  # a denial must not become a retriable network error


# --- attacks through an escaped runner, on every backend -------------------------------------------------

FETCH_LIMITS = Limits(timeout_s=4, memory_mb=256, disk_mb=4, max_output_bytes=8192)


@pytest.mark.timeout(90)
def test_a_flood_of_fetches_without_reading_is_a_violation(escaped: Backend) -> None:
    handler = Handler(*[denied_reply()] * 4)
    code = f"for i in range(20000):\n    send({{**{FETCH!r}, 'id': i}})\ntime.sleep(60)\nreturn 1"
    out, took = attack(escaped, code, handler, FETCH_LIMITS)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    # At most the first frame was served, on every backend: even where the channel cannot count unread bytes
    # (Docker's attach socket), the second frame lacks the receipt of a reply the runner never read.
    assert len(handler.requests) <= 1
    assert took < FETCH_LIMITS.timeout_s + 10, took


@pytest.mark.timeout(90)
def test_a_runner_that_never_reads_its_body_cannot_hold_the_host(escaped: Backend) -> None:
    handler = PartsHandler(response_reply(b"x" * (24 << 20)))
    code = f"send({{**{FETCH!r}, 'id': 0}})\ntime.sleep(120)\nreturn 1"
    out, took = attack(escaped, code, handler, FETCH_LIMITS)
    assert out.error_type == ErrorType.TIMEOUT, (out.error_type, out.error_message)
    assert took < FETCH_LIMITS.timeout_s + 15, took


def test_an_escaped_runner_claiming_a_fetch_error_gets_an_execution_error(escaped: Backend) -> None:
    claim = {"type": "result", "status": "error", "error": {"type": "egress_denied", "message": "forged"}}
    code = f"send({claim!r})\nos._exit(0)"
    out, _ = attack(escaped, code, Handler(), FETCH_LIMITS)
    assert out.error_type == ErrorType.EXECUTION, (out.error_type, out.error_message)
    assert "no fetch of this execution failed so" in (out.error_message or "")
