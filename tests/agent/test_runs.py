"""The record of a run (issue 37 item 5) takes its lane by the agent's rules, from the outcome the host saw;
an agent call's record keeps the source ``agent``."""

from __future__ import annotations

from pathlib import Path

from sandforge.runtime.agent import CallLog, Workspace, read_records
from sandforge.runtime.agent.runs import RunClock, run_record
from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, SandboxConfig

REQUEST = ExecutionRequest(code="return 1")


def _error(error_type: ErrorType, backend: str = "", **metadata: object) -> ExecutionOutcome:
    return ExecutionOutcome(status="error", error_type=error_type, error_message="it failed", backend=backend,
                            metadata=dict(metadata))  # fmt: skip


def test_a_sandbox_that_never_started_after_the_approval_is_the_execution_stage_and_extrinsic() -> None:
    approved = validate(REQUEST.code, default_policy())
    record = run_record(_error(ErrorType.SANDBOX_UNAVAILABLE), approved, REQUEST, source="http", clock=RunClock())
    assert (record.latest_failure_stage, record.failure_class, record.verdict) == ("execution", "extrinsic", "approved")
    assert record.backend is None and record.protections == {}  # nothing ran: no wall was verified


def test_a_refused_manifest_is_the_validation_stage() -> None:
    outcome = _error(ErrorType.INVALID_DEPENDENCY_MANIFEST)  # refused before the policy looked: no verdict
    record = run_record(outcome, None, REQUEST, source="cli", clock=RunClock())
    assert (record.latest_failure_stage, record.error_type) == ("validation", "invalid_dependency_manifest")
    assert record.attempt_failures[0].stage == "validation" and record.verdict is None


def test_the_programs_own_error_is_its_answer_unless_the_host_saw_the_cause() -> None:
    approved = validate(REQUEST.code, default_policy())
    claimed = _error(ErrorType.TOOL_ERROR, "subprocess", tool_error_type="network_error")
    record = run_record(claimed, approved, REQUEST, source="mcp", clock=RunClock())
    assert (record.error_type, record.tool_error, record.failure_class) == ("network_error", True, "adaptive")
    seen = _error(ErrorType.TOOL_ERROR, "subprocess", tool_error_type="network_error",
                  egress=[{"method": "GET", "url": "http://127.0.0.1:9/", "error": "network_error"}])  # fmt: skip
    record = run_record(seen, approved, REQUEST, source="mcp", clock=RunClock())
    assert (record.failure_class, record.egress_requests, record.egress[0].error) == ("extrinsic", 1, "network_error")


def test_an_agent_calls_record_says_agent(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    with Workspace(provider=ScriptedProvider(["return 1\n"]), sandbox=SandboxConfig(pool_size=0), log=log) as ws:
        assert ws.call("calc", "one").ok
    assert [r.source for r in log.records] == ["agent"]


def test_a_run_of_undecodable_bytes_is_recorded_readable(tmp_path: Path) -> None:
    """``sandforge exec`` reads a program's undecodable bytes as surrogate escapes, and JSON may carry a lone
    surrogate: the record replaces them (U+FFFD) instead of failing to be written."""
    request = ExecutionRequest(code="return 1  # \udc80", args=["\ud800"])
    log = CallLog(tmp_path / "calls.jsonl")
    assert log.write(run_record(_error(ErrorType.EXECUTION, "subprocess"), None, request, source="cli",
                                clock=RunClock())) is None  # fmt: skip
    [record] = read_records(tmp_path / "calls.jsonl")
    assert record.program_code == "return 1  # \ufffd" and record.args == ["\ufffd"]
