"""OpenTelemetry spans and metrics of real calls (issue 21) on the subprocess sandbox, read back from the SDK's
in-memory exporter: names after the GenAI conventions, parentage across nested calls, attributes, events for
failed attempts, metrics that mirror the call log, and nothing secret in any attribute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from sandforge.runtime.agent import CallLog, Workspace, read_records
from sandforge.runtime.guardrails import Policy, default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import SandboxConfig
from tests.egress import servers
from tests.telemetry.conftest import Otel, loopback_egress_policy

SECRET = "s3cr3t-otel-token-0123456789"
RECOVERABLE = "import os\ncontext['cwd'] = os.getcwd()\nreturn 1\n"
PARENT = "r = tool('helper').double(args[0])\nreturn {'inner': r.value}\n"
CHILD = "return args[0] * 2\n"


def make(workspaces: list[Workspace], tmp_path: Path, programs: list[str], policy: Policy | None = None,
         pool_size: int = 0) -> Workspace:  # fmt: skip
    ws = Workspace(
        provider=ScriptedProvider(programs), sandbox=SandboxConfig(backend="subprocess", pool_size=pool_size),
        log=CallLog(tmp_path / "calls.jsonl"), policy=policy or default_policy(),
    )  # fmt: skip
    workspaces.append(ws)
    return ws


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_call_is_an_execute_tool_span_with_its_stages_as_children(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    ws = make(workspaces, tmp_path, ["context['n'] = args[0]\nreturn args[0] + 1\n"])
    out = ws.call("calc", "inc", 41)
    assert out.ok and out.value == 42
    call = otel.one("execute_tool calc.inc")
    a = attrs(call)
    assert a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.name"] == "calc.inc"
    assert a["gen_ai.tool.call.id"] == out.metadata["call_id"] and a["sandforge.trace_id"] == out.metadata["trace_id"]
    assert (a["sandforge.status"], a["sandforge.program_source"], a["sandforge.artifact_hit"]) == (
        "ok",
        "generated",
        False,
    )
    assert a["sandforge.backend"] == "subprocess" and a["sandforge.attempts"] == 1
    assert call.parent is None and call.status.status_code is StatusCode.UNSET
    names = [s.name for s in otel.children(call)]
    assert names == ["chat", "sandforge.validate", "sandforge.execute", "sandforge.commit"]
    chat = otel.one("chat")
    assert chat.kind is SpanKind.CLIENT and attrs(chat)["gen_ai.provider.name"] == "scripted"
    assert attrs(otel.one("sandforge.validate"))["sandforge.verdict"] == "approved"
    execute = otel.one("sandforge.execute")
    [acquire] = otel.children(execute)
    assert acquire.name == "sandforge.sandbox.acquire" and attrs(acquire)["sandforge.sandbox.start"] == "cold"
    assert execute.start_time is not None and acquire.start_time is not None and acquire.end_time is not None
    assert execute.start_time <= acquire.start_time <= acquire.end_time
    assert attrs(execute)["sandforge.ok"] is True
    # the metrics mirror the call log
    [record] = list(read_records(tmp_path / "calls.jsonl"))
    calls = otel.points("sandforge.calls")
    assert calls == [({"sandforge.role": "calc", "sandforge.method": "inc", "sandforge.status": record.status,
                       "sandforge.program_source": "generated"}, 1)]  # fmt: skip
    assert otel.points("sandforge.sandbox.acquisitions") == [
        ({"sandforge.backend": "subprocess", "sandforge.sandbox.start": "cold"}, 1)
    ]
    [(hist_attrs, count)] = otel.points("sandforge.execution.duration")
    assert hist_attrs["sandforge.status"] == "ok" and count == 1
    assert otel.points("sandforge.call.failures") == []


def test_a_warm_pool_hit_is_told_apart_from_a_cold_start(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    ws = make(workspaces, tmp_path, ["return 1\n"], pool_size=1)
    assert ws.sandbox.pool("subprocess").wait_ready(1, timeout=60)
    assert ws.call("calc", "one").ok
    assert attrs(otel.one("sandforge.sandbox.acquire"))["sandforge.sandbox.start"] == "warm"
    assert otel.points("sandforge.sandbox.acquisitions") == [
        ({"sandforge.backend": "subprocess", "sandforge.sandbox.start": "warm"}, 1)
    ]


def test_nested_calls_are_children_of_their_parents_execution(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    ws = make(workspaces, tmp_path, [PARENT, CHILD])
    out = ws.call("boss", "run", 21)
    assert out.ok and out.value == {"inner": 42}
    parent, child = otel.one("execute_tool boss.run"), otel.one("execute_tool helper.double")
    assert parent.context is not None and child.context is not None
    assert child.context.trace_id == parent.context.trace_id
    execute = [s for s in otel.children(parent) if s.name == "sandforge.execute"]
    assert len(execute) == 1 and child.parent is not None
    assert execute[0].context is not None and child.parent.span_id == execute[0].context.span_id
    assert attrs(child)["sandforge.depth"] == 1
    assert attrs(child)["sandforge.parent_call_id"] == attrs(parent)["gen_ai.tool.call.id"]
    assert [s.name for s in otel.children(child)] == ["chat", "sandforge.validate", "sandforge.execute",
                                                      "sandforge.commit"]  # fmt: skip
    assert sorted(a["sandforge.role"] for a, _ in otel.points("sandforge.calls")) == ["boss", "helper"]


def test_each_failed_attempt_is_an_event_and_a_failed_call_an_error(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    ws = make(workspaces, tmp_path, [RECOVERABLE, "return 1 / 0\n", "return 1 / 0\n", "return 1 / 0\n"])
    out = ws.call("calc", "div")
    assert not out.ok
    call = otel.one("execute_tool calc.div")
    assert call.status.status_code is StatusCode.ERROR
    a = attrs(call)
    assert a["error.type"] == out.error_type and a["sandforge.failure_class"] == out.metadata["failure_class"]
    events = [e for e in call.events if e.name == "sandforge.attempt.failed"]
    failures = out.metadata["attempt_failures"]
    assert len(events) == len(failures) >= 2
    assert [dict(e.attributes or {})["sandforge.failure.stage"] for e in events] == [f["stage"] for f in failures]
    assert dict(events[0].attributes or {})["sandforge.failure.error_class"] == "forbidden_module"
    assert any(a.get("error.type") == out.error_type for a, _ in otel.points("sandforge.call.failures"))
    stages = sorted(a["sandforge.failure.stage"] for a, _ in otel.points("sandforge.attempt.failures"))
    assert stages == sorted({f["stage"] for f in failures})
    assert len(otel.named("chat")) == len(failures)  # one generation per attempt


def test_an_egress_request_is_a_client_span_without_path_query_or_credential(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = servers.start()
    try:
        monkeypatch.setenv("OTEL_TEST_EGRESS_TOKEN", SECRET)
        policy = loopback_egress_policy(tmp_path / "policy", server.port, "OTEL_TEST_EGRESS_TOKEN")
        program = (
            f"r = fetch('http://allowed.test:{server.port}/echo?key={SECRET}x')\n"
            "try:\n    fetch(kwargs['elsewhere'])\nexcept Exception:\n    pass\n"
            "return r.status\n"
        )
        ws = make(workspaces, tmp_path, [program], policy=policy)
        out = ws.call("news", "latest", SECRET, elsewhere=f"http://denied.test:{server.port}/x")
    finally:
        server.close()
    assert out.ok and out.value == 200, out
    requests = otel.named("sandforge.egress")
    assert [attrs(s)["sandforge.egress.decision"] for s in requests] == ["allowed", "denied"]
    allowed, denied = requests
    assert allowed.kind is SpanKind.CLIENT and attrs(allowed)["server.address"] == "allowed.test"
    assert attrs(allowed)["server.port"] == server.port and attrs(allowed)["http.response.status_code"] == 200
    assert denied.status.status_code is StatusCode.ERROR and attrs(denied)["error.type"] == "egress_denied"
    execute = otel.one("sandforge.execute")
    assert execute.context is not None
    assert all(s.parent is not None and s.parent.span_id == execute.context.span_id for s in requests)
    assert [v for _, v in otel.points("sandforge.egress.denials")] == [1]
    assert sorted(a["sandforge.egress.decision"] for a, _ in otel.points("sandforge.egress.requests")) == [
        "allowed", "denied"]  # fmt: skip
    # no secret anywhere: not the credential, not the argument, not the query
    for span in otel.spans():
        text = json.dumps([attrs(span), [dict(e.attributes or {}) for e in span.events], span.status.description])
        assert SECRET not in text, span.name


def test_arguments_and_results_are_recorded_only_when_asked(
    otel_io: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    ws = make(workspaces, tmp_path, ["return {'echo': args[0]}\n"])
    assert ws.call("calc", "echo", "hello").ok
    a = attrs(otel_io.one("execute_tool calc.echo"))
    assert json.loads(a["gen_ai.tool.call.arguments"]) == {"args": ["hello"], "kwargs": {}}
    assert json.loads(a["gen_ai.tool.call.result"]) == {"echo": "hello"}


def test_by_default_no_argument_result_or_program_is_recorded(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    program = f"x = {SECRET!r}\nreturn {{'echo': args[0], 'x': x}}\n"
    ws = make(workspaces, tmp_path, [program])
    assert ws.call("calc", "echo", SECRET + "-arg").ok
    for span in otel.spans():
        assert SECRET not in json.dumps([attrs(span), [dict(e.attributes or {}) for e in span.events]]), span.name
        assert "gen_ai.tool.call.arguments" not in attrs(span) and "gen_ai.tool.call.result" not in attrs(span)


def test_a_persisted_artifact_is_an_artifact_hit_without_a_generation_span(
    otel: Otel, tmp_path: Path, workspaces: list[Workspace]
) -> None:
    from sandforge.runtime.store import ToolStore

    program = "context['m'] = context.get('m', 0) + args[0]\nreturn context['m']\n"

    def session(programs: list[str]) -> Workspace:
        ws = Workspace(provider=ScriptedProvider(programs), sandbox=SandboxConfig(backend="subprocess", pool_size=0),
                       store=ToolStore(tmp_path / "state"), log=CallLog(tmp_path / "calls.jsonl"))  # fmt: skip
        workspaces.append(ws)
        return ws

    first = session([program])
    assert first.call("calc", "add", 3).ok
    first.close()
    otel.exporter.clear()
    second = session([])  # a new workspace and store instance: the program comes from the store
    out = second.call("calc", "add", 4)
    assert out.ok and out.metadata["program_source"] == "persisted"
    call = otel.one("execute_tool calc.add")
    assert attrs(call)["sandforge.artifact_hit"] is True and attrs(call)["sandforge.program_source"] == "persisted"
    assert otel.named("chat") == []  # no generation: no model call
    assert [s.name for s in otel.children(call)] == ["sandforge.validate", "sandforge.execute", "sandforge.commit"]
