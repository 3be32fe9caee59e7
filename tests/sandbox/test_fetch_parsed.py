"""The fetch frame parsed once (issue 18's speed work): a handler with ``egress_request`` gets the request as
the exchange decoded it from the program's frame and answers a mapping, which the exchange checks like any
reply; the agent's and ``sandforge exec``'s bridges and the broker's session speak it, with the same
decisions as the JSON entry points."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from sandforge.runtime.agent.egress import NO_GRANT, ExecutionEgress, StandaloneBridge
from sandforge.runtime.egress import EgressBroker, EgressPolicy, EgressSection, FetchRequest
from sandforge.runtime.egress.broker import EgressRecord, _Draft
from sandforge.sandbox.protocol import CallFrame
from tests.sandbox.test_fetch_wire import FETCH, OK, Handler, replies, run
from tests.sandbox.test_host_channel import frame


class ParsedHandler(Handler):
    """Answers through ``egress_request`` only (its ``egress`` would fail the test if the exchange used it)."""

    def __init__(self, *answers: Mapping[str, Any], body: bytes | None = None) -> None:
        super().__init__()
        self.answers = list(answers)
        self.body = body
        self.parsed: list[Mapping[str, Any]] = []

    def egress(self, request: bytes, deadline: float) -> bytes:
        raise AssertionError("the exchange encoded the request again instead of passing the parsed one")

    def egress_request(self, request: Mapping[str, Any], deadline: float) -> tuple[Mapping[str, Any], bytes | None]:
        self.parsed.append(request)
        answer = self.answers.pop(0)
        return answer, self.body if "response" in answer else None


RESPONSE = {"status": 200, "headers": {"content-type": "text/plain"}, "url": "https://news.example.com/rss",
            "body_b64": "", "elapsed_ms": 2.0}  # fmt: skip


def test_the_handler_gets_the_parsed_request_and_the_body_travels_raw() -> None:
    handler = ParsedHandler({"response": RESPONSE, "error": None}, body=b"\x00raw body\xff")
    out, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=handler)
    assert out.ok and handler.parsed == [FETCH["request"]]
    header, raw = replies(io)
    assert json.loads(header)["response"]["body_bytes"] == len(raw) and raw == b"\x00raw body\xff"


@pytest.mark.parametrize(
    "answer",
    [{"response": None, "error": None}, {"error": {"kind": "timeout", "message": "x"}},
     {"response": {**RESPONSE, "status": 42}}, {"response": {**RESPONSE, "body_b64": "***"}}],
    ids=["neither", "an unknown kind", "a status out of range", "neither a raw body nor base64"],
)  # fmt: skip
def test_a_malformed_parsed_answer_is_a_network_error_for_the_program(answer: dict[str, Any]) -> None:
    handler = ParsedHandler(answer)
    _, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=handler)
    [header] = replies(io)
    assert json.loads(header)["error"]["kind"] == "network_error"


def test_a_raising_handler_is_a_network_error_for_the_program() -> None:
    class Broken(ParsedHandler):
        def egress_request(self, request: Mapping[str, Any], deadline: float) -> tuple[Mapping[str, Any], bytes]:
            raise RuntimeError("broker bug")

    _, io = run(frame({**FETCH, "id": 0}), frame(OK), handler=Broken())
    [header] = replies(io)
    assert json.loads(header)["error"]["kind"] == "network_error"


# --- the host's side: the same decisions as the JSON entry points ------------------------------------------


def _policy(**section: Any) -> EgressPolicy:
    return EgressPolicy().merge(EgressSection.model_validate(section))


@pytest.mark.parametrize(
    "request_",
    [{"url": "https://news.example.com/rss"}, {"url": "http://127.0.0.1/"}, {"url": "not a url"},
     {"url": "https://a.test/", "headers": {"Host": "evil"}}, {"url": "https://a.test/", "method": "BREW"},
     {"url": 7}, {"nothing": True}],
    ids=["no rule", "loopback", "not a URL", "a forbidden header", "a method", "not text", "no url"],
)  # fmt: skip
def test_handle_request_answers_what_handle_parts_answers(request_: dict[str, Any]) -> None:
    """Nothing is reachable under an empty allow list: both entry points refuse alike (nothing is sent)."""
    broker = EgressBroker(_policy())
    parsed, parsed_body = broker.session().handle_request(request_)
    wire, wire_body = broker.session().handle_parts(json.dumps(request_).encode())
    assert parsed == json.loads(wire) and parsed_body is wire_body is None
    assert parsed["response"] is None and parsed["error"]["kind"] in ("egress_denied", "invalid_fetch")


def test_execution_egress_without_the_grant_denies_and_notes_it() -> None:
    fetches = ExecutionEgress(NO_GRANT)
    reply, body = fetches.egress_request({"url": "https://news.example.com/rss"}, deadline=1e12)
    assert body is None and reply["error"]["kind"] == "egress_denied" and reply["error"]["reason"] == "not_granted"
    assert fetches.replied("egress_denied") and fetches.records[0].url == "https://news.example.com/rss"


def test_execution_egress_notes_the_kinds_it_replied() -> None:
    fetches = ExecutionEgress(EgressBroker(_policy()))
    fetches.egress_request({"url": "https://news.example.com/rss"}, deadline=1e12)
    fetches.egress_request({"url": "x", "method": "BREW"}, deadline=1e12)
    assert fetches.replied("egress_denied") and fetches.replied("invalid_fetch")
    assert not fetches.replied("network_error")
    assert [record.error for record in fetches.records] == ["egress_denied", "invalid_fetch"]


def test_the_standalone_bridge_speaks_the_parsed_form() -> None:
    bridge = StandaloneBridge(ExecutionEgress(NO_GRANT))
    reply, _ = bridge.egress_request({"url": "https://a.test/"}, deadline=1e12)
    assert reply["error"]["kind"] == "egress_denied"
    assert bridge(CallFrame.model_validate({"type": "call", "id": 0, "target": {"kind": "tool", "name": "t"},
                                            "method": "run"})).status == "error"  # fmt: skip


def test_a_record_draft_has_the_record_fields() -> None:
    assert set(_Draft.__slots__) == set(EgressRecord.model_fields)
    session = EgressBroker(_policy()).session()
    session.handle_request(FetchRequest.of("https://a.test/").model_dump())
    [record] = session.records
    assert isinstance(record, EgressRecord) and record.denied and record.error == "egress_denied"
    assert EgressRecord.model_validate(record.model_dump()) == record
