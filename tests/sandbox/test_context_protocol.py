"""The per-key lazy context protocol: the program's ``context`` behaves like a dict, only changes come back,
and whatever the sandbox sends back about the context is checked before anything is built from it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox import exchange as exchange_module
from sandforge.sandbox.channel import Stream, WorkerIO
from sandforge.sandbox.context import ContextError, ContextSnapshot
from sandforge.sandbox.exchange import Exchange, run_exchange
from sandforge.sandbox.protocol import HEADER, ResultFrame

CTX: dict[str, Any] = {"a": 1, "b": {"x": [1, 2]}, "s": "żółw 🐢", "rows": [1, 2, 3], "n": None}

#: Every mapping operation a tool program uses; each must give what it gives on a plain dict.
PROGRAMS = [
    "return context['a']",
    "return [context.get('b'), context.get('zz', 5), context.get('zz')]",
    "return [context.setdefault('a', 9), context.setdefault('new', [1]), context['new']]",
    "return ['a' in context, 'zz' in context, len(context), bool(context)]",
    "return [k for k in context]",
    "return list(context.keys())",
    "return list(context.values())",
    "return [[k, v] for k, v in context.items()]",
    "return sorted(context)",
    "return list(reversed(context))",
    "return [context.pop('a'), context.pop('zz', 'dflt')]",
    "return list(context.popitem())",
    "context.update({'a': 2}, c=3)\nreturn 1",
    "context.update(context.copy())\nreturn 1",
    "del context['b']\nreturn 1",
    "c = context.copy()\nc['a'] = 100\nc['rows'].append(9)\nreturn [c, context['a']]",
    "return dict(context)",
    "return {**context, 'z': 1}",
    "return context | {'a': 5}",
    "return {'a': 5} | context",
    "context |= {'q': 1}\nreturn 1",
    "return [context == dict(context), context != {}, {'a': 1} == context, context == CTXCOPY]",
    "return repr(context)",
    "return str(context)",
    "return repr(context.keys())",
    "return sorted(context.keys() & {'a', 'zz'})",
    "import json\nreturn json.dumps(context)",
    "import json\nreturn json.dumps({'wrapped': context}, sort_keys=True)",
    "import json\nreturn json.loads(json.dumps(context, default=str))",
    "import json\nreturn json.JSONEncoder().encode(context)",
    "import copy\nreturn [copy.copy(context), copy.deepcopy(context)]",
    "return isinstance(context, dict)",
    "context['rows'].append(4)\nreturn 1",
    "context['a'] += 1\nreturn context['a']",
    "context.clear()\nreturn len(context)",
    "for k in list(context):\n    if k != 'a':\n        del context[k]\nreturn 1",
    "return max(context, key=lambda k: len(str(context[k])))",
    "return [k for k in context if context[k] == 1]",
    "context['b']['x'] = 'replaced'\nreturn context['b']",
    "x = context['rows']\ncontext['copy'] = x\nx.append(7)\nreturn 1",
    "return context",
]


def run_plain(code: str, context: dict[str, Any]) -> Any:
    """The oracle: the same body as a plain Python function over a plain dict."""
    source = "def program(context, args, kwargs):\n" + "\n".join("    " + line for line in code.splitlines())
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own fixed test programs
    return namespace["program"](context, [], {})


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=2)) as sandbox:
        yield sandbox


def execute(sb: Sandbox, code: str, context: dict[str, Any] | ContextSnapshot, **kw: Any) -> ExecutionOutcome:
    return sb.execute(ExecutionRequest(code=code, context=context, **kw))


@pytest.mark.parametrize("code", PROGRAMS)
def test_mapping_operations_behave_like_a_dict(sb: Sandbox, code: str) -> None:
    code = code.replace("CTXCOPY", repr(CTX))
    expected_ctx = json.loads(json.dumps(CTX))
    expected = json.loads(json.dumps(run_plain(code, expected_ctx)))
    out = execute(sb, code, CTX)
    assert out.ok, (code, out.error_type, out.error_message)
    assert out.value == expected, code
    assert out.context == expected_ctx, code
    assert list(out.context) == list(expected_ctx) or set(out.context) == set(expected_ctx), code


def test_a_placeholder_never_leaks(sb: Sandbox) -> None:
    """The keys view is not the dict's own (whose ``.mapping`` would expose undecoded entries)."""
    out = execute(sb, "return getattr(context.keys(), 'mapping', 'absent')", CTX)
    assert out.ok and out.value == "absent"
    out = execute(sb, "v = context.keys()\nreturn [k for k in v] + [context[k] for k in v]", {"x": 1, "y": [2]})
    assert out.ok and out.value == ["x", "y", 1, [2]]


def _capture_results(monkeypatch: pytest.MonkeyPatch) -> list[ResultFrame]:
    seen: list[ResultFrame] = []
    accept = exchange_module._accept_result

    def spy(ex: Exchange, frame: ResultFrame, size: int, max_bytes: int) -> None:
        seen.append(frame)
        accept(ex, frame, size, max_bytes)

    monkeypatch.setattr(exchange_module, "_accept_result", spy)
    return seen


def test_only_changed_keys_come_back(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _capture_results(monkeypatch)
    snapshot = ContextSnapshot.from_dict({"big": ["row"] * 50_000, "read": {"k": [1.5, "two"]}, "gone": 1})
    code = "context['count'] = context.get('count', 0) + 1\nn = len(context['read'])\ndel context['gone']\nreturn n"
    out = execute(sb, code, snapshot)
    assert out.ok, out.error_message
    assert results[-1].context_changed == [("count", 1)] and results[-1].context_deleted == ["gone"]
    after = out.context_snapshot
    assert after is not None and list(after) == ["big", "read", "count"]
    assert after["big"] is snapshot["big"] and after["read"] is snapshot["read"]  # shared, not re-sent
    assert "context" not in out.__dict__  # nothing decoded on the host so far
    assert out.context == {"big": ["row"] * 50_000, "read": {"k": [1.5, "two"]}, "count": 1}


def test_chained_executions_carry_the_snapshot(sb: Sandbox) -> None:
    snapshot = ContextSnapshot.from_dict({"rows": list(range(10_000))})
    rows = snapshot["rows"]
    for expected in (1, 2, 3):
        out = execute(sb, "context['count'] = context.get('count', 0) + 1\nreturn len(context)", snapshot)
        assert out.ok and out.value == 2
        assert out.context_snapshot is not None
        snapshot = out.context_snapshot
        assert snapshot.value("count") == expected and snapshot["rows"] is rows


def test_every_backend_carries_and_changes_keys(sandbox: Sandbox) -> None:
    """The protocol is the same on every backend (the container ones read and write it over other streams)."""
    snapshot = ContextSnapshot.from_dict({"big": ["row"] * 30_000, "rows": [1], "gone": True})
    code = "context['rows'].append(len(context))\ndel context['gone']\nimport json\nreturn len(json.dumps(context))"
    out = sandbox.execute(ExecutionRequest(code=code, context=snapshot, limits=sandbox.config.limits))
    assert out.ok, (out.error_type, out.error_message)
    after = out.context_snapshot
    assert after is not None and after["big"] is snapshot["big"] and after.value("rows") == [1, 3]
    assert "gone" not in after and out.value == len(json.dumps({"big": ["row"] * 30_000, "rows": [1, 3]}))


def test_nested_calls_receive_the_context_as_a_dict(sb: Sandbox) -> None:
    seen: list[Any] = []

    def bridge(call: Any) -> dict[str, Any]:
        seen.append(call.args)
        return {"status": "ok", "value": sorted(call.args[0])}

    code = "r = tool('t').keys_of(context)\nreturn r.value"
    out = sb.execute(ExecutionRequest(code=code, context={"b": [1], "a": {"x": None}}), bridge=bridge)
    assert out.ok and out.value == ["a", "b"]
    assert seen == [[{"b": [1], "a": {"x": None}}]]


def test_mutation_in_place_is_detected(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _capture_results(monkeypatch)
    out = execute(sb, "context['rows'].append(1)\nreturn len(context['other'])", {"rows": [0], "other": [1, 2]})
    assert out.ok and out.context == {"rows": [0, 1], "other": [1, 2]}
    assert [key for key, _ in results[-1].context_changed] == ["rows"]


def test_a_key_restored_to_its_value_is_unchanged(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _capture_results(monkeypatch)
    out = execute(sb, "context['rows'].append(1)\ncontext['rows'].pop()\nreturn 1", {"rows": [0, 2.5, "x"]})
    assert out.ok and out.context == {"rows": [0, 2.5, "x"]}
    assert results[-1].context_changed == []


def test_deleting_every_key(sb: Sandbox) -> None:
    out = execute(sb, "for k in list(context):\n    context.pop(k)\nreturn len(context)", {"a": 1, "b": [2]})
    assert out.ok and out.value == 0 and out.context == {}
    assert out.context_snapshot == ContextSnapshot()


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("context['s'] = {1, 2}\nreturn 1", "the new context contains a value of type set, which is not JSON"),
        ("context[1] = 'x'\ncontext['1'] = 'y'\nreturn 1", "both become '1'"),
        ("context['d'] = {1: 'a', '1': 'b'}\nreturn 1", "both become '1'"),
        ("context['d'] = {True: 'a', 'true': 'b'}\nreturn 1", "both become 'true'"),
        ("context['d'] = {(1, 2): 'a'}\nreturn 1", "dict key of type tuple"),
        ("return [{None: 1, 'null': 2}]", "both become 'null'"),
        ("context['f'] = float('inf')\nreturn 1", "non-finite float"),
        ("return {1, 2}", "the return value contains a value of type set, which is not JSON"),
        ("x = []\nfor i in range(300):\n    x = [x]\ncontext['deep'] = x\nreturn 1", "nested more than 200 levels"),
    ],
)
def test_non_json_from_the_program_is_non_serializable(sb: Sandbox, code: str, needle: str) -> None:
    out = execute(sb, code, {"a": 1})
    assert out.error_type == ErrorType.NON_SERIALIZABLE_RESULT, (code, out.error_type, out.error_message)
    assert needle in (out.error_message or ""), out.error_message
    assert out.context is None and out.context_snapshot is None


def test_number_bool_and_none_keys_become_strings_as_json_dumps_makes_them(sb: Sandbox) -> None:
    """Issue 38: ``{year: total}`` is a JSON object with the keys as strings, in results and committed
    contexts alike, as every JSON tool boundary sends it."""
    code = (
        "totals = {2024: 10, 2025: 12}\n"
        "context['by_year'] = totals\n"
        "context[7] = 'seven'\n"
        "return [totals, {1.5: 'a', True: 'b', None: 'c'}, (1, {2: (3,)})]"
    )
    out = execute(sb, code, {"a": 1})
    assert out.ok, out.error_message
    assert out.value == [{"2024": 10, "2025": 12}, {"1.5": "a", "true": "b", "null": "c"}, [1, {"2": [3]}]]
    assert out.context == {"a": 1, "by_year": {"2024": 10, "2025": 12}, "7": "seven"}


def test_a_changed_key_over_the_message_limit_is_an_output_limit(sb: Sandbox) -> None:
    limits = Limits(max_message_bytes=64 * 1024)
    out = execute(sb, "context['big'] = 'x' * 100000\nreturn 1", {"small": 1}, limits=limits)
    assert out.error_type == ErrorType.OUTPUT_LIMIT and out.context is None


def test_non_json_on_the_host_is_an_invalid_request(sb: Sandbox) -> None:
    for bad in ({"s": {1, 2}}, {"f": float("nan")}, {"o": object()}, {"deep": {"x": math.inf}}):
        with pytest.raises(ContextError):
            ContextSnapshot.from_dict(bad)
        with pytest.raises(ValidationError):
            ExecutionRequest(code="return 1", context=bad)
        out = sb.execute(ExecutionRequest.model_construct(code="return 1", context=bad, args=[], kwargs={},
                                                          limits=sb.config.limits))  # fmt: skip
        assert out.error_type == ErrorType.INVALID_REQUEST and "not JSON" in (out.error_message or "")
    with pytest.raises(ValidationError):
        ExecutionRequest(code="return 1", context={1: "int key"})


# --- the snapshot and the models ------------------------------------------------------------------------


def test_snapshot_encodes_once_and_shares_unchanged_bytes() -> None:
    snap = ContextSnapshot.from_dict({"a": [1, 2], "s": "żółw", "n": None})
    assert snap["a"] == b"[1,2]" and snap["s"] == '"żółw"'.encode() and snap.nbytes == 5 + 9 + 4
    derived = snap.with_changes({"a": b"3", "new": b"{}"}, ["n"])
    assert list(derived) == ["a", "s", "new"] and derived["s"] is snap["s"]
    assert derived.to_dict() == {"a": 3, "s": "żółw", "new": {}} and derived.value("a") == 3
    assert snap.to_dict() == {"a": [1, 2], "s": "żółw", "n": None}  # unchanged itself
    assert ContextSnapshot.from_dict(snap) is snap
    assert ContextSnapshot.from_dict({"a": [1, 2], "s": "żółw", "n": None}) == snap


def test_request_dumps_and_describes_the_context_as_an_object() -> None:
    request = ExecutionRequest(code="return 1", context={"a": [1, {"b": None}]})
    assert isinstance(request.context, ContextSnapshot)
    assert request.model_dump()["context"] == {"a": [1, {"b": None}]}
    assert json.loads(request.model_dump_json())["context"] == {"a": [1, {"b": None}]}
    for mode in ("validation", "serialization"):
        schema = ExecutionRequest.model_json_schema(mode=mode)  # type: ignore[arg-type]
        assert schema["properties"]["context"]["type"] == "object"
    assert ExecutionRequest(code="return 1").context == ContextSnapshot()


def test_outcome_decodes_its_context_lazily() -> None:
    snap = ContextSnapshot.from_dict({"k": [1], "m": "v"})
    out = ExecutionOutcome.succeeded(1, snap)
    assert out.context_snapshot is snap and "context" not in out.__dict__
    assert out.model_dump()["context"] == {"k": [1], "m": "v"}
    assert json.loads(ExecutionOutcome.succeeded(1, snap).model_dump_json())["context"] == {"k": [1], "m": "v"}
    assert ExecutionOutcome.succeeded(1, snap) == out
    assert ExecutionOutcome.failure(ErrorType.TIMEOUT, "slow").context_snapshot is None
    assigned = ExecutionOutcome.succeeded(1, snap)
    assigned.context = {"other": True}
    assert assigned.context_snapshot == ContextSnapshot.from_dict({"other": True})


# --- forged result frames (the host's side of the protocol) ------------------------------------------------


class ScriptedIO(WorkerIO):
    """A worker that answers the execute frame with the given bytes on the result channel, then ends."""

    def __init__(self, result_bytes: bytes) -> None:
        self.sent = bytearray()
        self.chunks: list[tuple[Stream, bytes]] = [("result", result_bytes), ("result", b""), ("stdout", b""),
                                                   ("stderr", b"")]  # fmt: skip

    def send(self, data: bytes, deadline: float | None = None) -> None:
        self.sent += data

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        chunks, self.chunks = self.chunks, []
        return chunks


def frame(body: bytes | dict[str, Any]) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HEADER.pack(len(data)) + data


def result(**fields: Any) -> dict[str, Any]:
    return {"type": "result", "status": "ok", "value": 1, **fields}


ERROR = {"type": "execution", "message": "x"}
FORGED = {
    "length differs from the announcement": frame(result(context_changed=[["k", 5]])) + frame(b"123"),
    "text is not JSON": frame(result(context_changed=[["k", 5]])) + frame(b"{nope"),
    "text is NaN": frame(result(context_changed=[["k", 3]])) + frame(b"NaN"),
    "text is Infinity inside": frame(result(context_changed=[["k", 10]])) + frame(b"[Infinity]"),
    "text is not UTF-8": frame(result(context_changed=[["k", 3]])) + frame(b'"\xff"'),
    "two JSON documents": frame(result(context_changed=[["k", 3]])) + frame(b"1 2"),
    "announces more than the limit": frame(result(context_changed=[["k", 1 << 30]])),
    "key frame missing": frame(result(context_changed=[["k", 1]])),
    "key named twice": frame(result(context_changed=[["k", 1], ["k", 1]])) + frame(b"1") + frame(b"1"),
    "deletes an unknown key": frame(result(context_deleted=["nope"])),
    "changes and deletes a key": frame(result(context_changed=[["a", 1]], context_deleted=["a"])) + frame(b"1"),
    "error result with changes": frame(result(status="error", error=ERROR, context_changed=[["k", 1]])) + frame(b"1"),
    "whole context, protocol 1": frame(result(context={"admin": True})),
    "data after the key frames": frame(result(context_changed=[["k", 1]])) + frame(b"1") + frame(b"2"),
    "negative length": frame(result(context_changed=[["k", -1]])),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_result_frames_are_violations(name: str) -> None:
    limits = Limits(max_message_bytes=1 << 20)
    request = ExecutionRequest(code="return 1", context={"a": 1}, limits=limits)
    ex = run_exchange(ScriptedIO(FORGED[name]), request, None)
    assert ex.failure is not None and ex.failure[0] == ErrorType.SANDBOX_VIOLATION, (name, ex.failure)
    assert ex.context is None


def test_a_well_formed_result_applies_the_changes() -> None:
    request = ExecutionRequest(code="return 1", context={"a": 1, "b": 2})
    data = frame(result(context_changed=[["c", 7]], context_deleted=["a"])) + frame(b'{"x":1}')
    io = ScriptedIO(data)
    ex = run_exchange(io, request, None)
    assert ex.failure is None and ex.context is not None
    assert ex.context.to_dict() == {"b": 2, "c": {"x": 1}}
    sent = bytes(io.sent)
    (size,) = HEADER.unpack_from(sent)
    header = json.loads(sent[4 : 4 + size])
    assert header["context_keys"] == [["a", 1], ["b", 1]] and "context" not in header
    assert sent[4 + size :] == frame(b"1") + frame(b"2")  # each key's text as its own frame, not re-encoded


def test_forged_frames_from_an_escaped_program_commit_nothing() -> None:
    """End to end: a program that owns the result channel forges a result whose changed key is not JSON."""
    from tests.sandbox.test_os_boundary import escaped

    header = json.dumps(result(context_changed=[["admin", 3]])).encode()
    code = (
        "import os, struct\n"
        f"header = {header!r}\n"
        "os.write(result_fd, struct.pack('>I', len(header)) + header + struct.pack('>I', 3) + b'NaN')\n"
        "os._exit(0)"
    )
    out = escaped(code, context={"a": 1})
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    assert out.context is None and out.context_snapshot is None
