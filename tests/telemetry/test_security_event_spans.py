"""Issue 36: an execution that ends on a security event is a ``sandforge.security_event`` span event with its
source and name (never its detail) on the execution's span, an attribute of the call's span and a count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from sandforge import Sandbox
from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import ExecutionRequest, SandboxConfig
from tests.security_programs import EVENT, SOURCE, VIOLATING
from tests.telemetry.conftest import Otel

SECURITY = {"sandforge.security_event.source": SOURCE, "sandforge.security_event.event": EVENT}


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def no_detail(otel: Otel) -> None:
    """The event's detail (here: the withheld name and why) stays in the call log, out of the execution spans
    and the security events (a failed attempt's event carries its message, as it did before issue 36)."""
    for span in otel.named("sandforge.exec"):
        texts = [str(v) for v in attrs(span).values()]
        texts += [
            str(v) for e in span.events if e.name == "sandforge.security_event" for v in (e.attributes or {}).values()
        ]
        assert not any("update_wrapper" in t for t in texts), span.name


def test_an_agent_calls_security_event_is_a_span_event_an_attribute_and_a_count(otel: Otel, tmp_path: Path) -> None:
    provider = ScriptedProvider([VIOLATING, "return 1\n"])
    with Workspace(provider=provider, sandbox=SandboxConfig(backend="subprocess", pool_size=0),
                   log=CallLog(tmp_path / "calls.jsonl")) as ws:  # fmt: skip
        outcome = ws.call("vault", "peek")
    assert outcome.ok
    first, second = sorted(otel.named("sandforge.execute"), key=lambda s: s.start_time or 0)
    [event] = [e for e in first.events if e.name == "sandforge.security_event"]
    assert dict(event.attributes or {}) == SECURITY
    assert SECURITY.items() <= attrs(first).items()
    assert not any(e.name == "sandforge.security_event" for e in second.events)
    assert "sandforge.security_event.source" not in attrs(second)
    call = otel.one("execute_tool vault.peek")
    assert attrs(call)["sandforge.security_events"] == 1
    [failed] = [e for e in call.events if e.name == "sandforge.attempt.failed"]
    assert SECURITY.items() <= dict(failed.attributes or {}).items()
    assert otel.points("sandforge.security_events") == [({**SECURITY, "sandforge.backend": "subprocess"}, 1)]
    no_detail(otel)


def test_a_programs_security_event_is_on_its_exec_span(otel: Otel) -> None:
    """``sandforge exec``, ``POST /v1/exec`` and MCP ``run_tool_code`` run programs through ``execute_program``."""
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        outcome, _ = execute_program(sb, ExecutionRequest(code=VIOLATING), policy=default_policy())
    assert outcome.security_event is not None
    assert SECURITY.items() <= attrs(otel.one("sandforge.exec")).items()
    execute = otel.one("sandforge.execute")
    assert [dict(e.attributes or {}) for e in execute.events if e.name == "sandforge.security_event"] == [SECURITY]
    assert otel.points("sandforge.security_events") == [({**SECURITY, "sandforge.backend": "subprocess"}, 1)]
    no_detail(otel)


def test_an_execution_without_a_security_event_has_none(otel: Otel) -> None:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        outcome, _ = execute_program(sb, ExecutionRequest(code="raise ValueError('x')\n"), policy=default_policy())
    assert not outcome.ok and outcome.security_event is None
    assert not any(e.name == "sandforge.security_event" for s in otel.spans() for e in s.events)
    assert otel.points("sandforge.security_events") == []
