"""Call-log records of runs: programs a caller handed in (``sandforge exec``, ``POST /v1/exec``, MCP
``run_tool_code``) rather than ones the lifecycle obtained for a tool call (issue 37 item 5).

A run has one attempt and no lane retries it, so its record says what that attempt did: the verdict and its
capabilities, the sandbox's protections, the host's fetches, the security event that ended it, and, when it
failed, the one ``attempt_failures`` entry with its stage (``validation`` or ``execution``) and class, sorted
by the same rules as an agent call's (``runtime.agent.failures``, ``runtime.agent.lanes``). A run commits no
tool state, so its record is written whether it succeeded or not: the log says what happened.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic_core import PydanticSerializationError

from sandforge.runtime.agent import failures as sort
from sandforge.runtime.agent.calllog import (
    MAX_STDOUT_CHARS,
    AttemptFailure,
    CallRecord,
    CallSecurityEvent,
    CallSource,
    EgressCall,
    FailureStage,
    Usage,
    bounded,
    bounded_json,
    capability,
    now_utc,
)
from sandforge.runtime.agent.egress import egress_of
from sandforge.runtime.agent.failures import FailureClass, classify_failure, classify_outcome
from sandforge.runtime.agent.ids import new_id
from sandforge.runtime.files.transfer import manifest
from sandforge.runtime.guardrails import ValidationResult
from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest

#: A run's ``role.method`` in the log: what ran is told by ``source``, never by a tool's name.
RUN_ROLE = "exec"
RUN_METHOD = "run"
#: What a run's environment adds to its outcome's metadata that the record keeps (issue 19).
#: A lone surrogate: what UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")
_ENV_FIELDS = ("env_id", "environment_cache_hit", "env_prepare_ms", "env_resolve_ms", "env_install_ms")


@dataclass(frozen=True)
class RunClock:
    """When a run started (wall clock, for the record) and how long it took (monotonic: a clock step moves
    neither)."""

    started: datetime = field(default_factory=now_utc)
    began: float = field(default_factory=time.monotonic)

    def seconds(self) -> float:
        return time.monotonic() - self.began


def _failure_fields(outcome: ExecutionOutcome, result: ValidationResult | None) -> tuple[dict[str, Any], FailureStage]:
    """The error's type, class and whether it is the program's own answer, and the stage that failed."""
    error_type = outcome.error_type.value if outcome.error_type else "execution"
    # refused: by the policy (its verdict), or before it by the manifest (no verdict, nothing ran); a sandbox
    # that never started after an approval failed in the execution stage, as the agent's lanes say
    refused = result.verdict != "approved" if result is not None else not outcome.backend
    if refused:
        extrinsic = result is not None and sort.policy_dependent(result)  # only the caller's grants refused it
        cls = FailureClass.EXTRINSIC if extrinsic else classify_failure(error_type)
        return {"error_type": error_type, "failure_class": cls.value, "tool_error": False}, "validation"
    if outcome.error_type is ErrorType.TOOL_ERROR:  # the program's own Outcome.error: its answer
        tool_type = str(outcome.metadata.get("tool_error_type") or "tool_error")
        seen = tool_type in sort.EGRESS_HOST_FAILURES and sort.host_observed(tool_type, outcome)  # the host saw it
        cls = FailureClass.EXTRINSIC if seen else classify_outcome(tool_type, tool_error=True,
                                                                   retriable=outcome.retriable)  # fmt: skip
        return {"error_type": tool_type, "failure_class": cls.value, "tool_error": True}, "execution"
    return {"error_type": error_type, "failure_class": classify_failure(error_type).value,
            "tool_error": False}, "execution"  # fmt: skip


def _encodable(record: CallRecord) -> CallRecord:
    """``record``, or a copy whose lone surrogates are U+FFFD: a run's code is the caller's bytes (``sandforge
    exec`` reads undecodable ones as surrogate escapes) and JSON may escape a lone surrogate, and the log is
    UTF-8. Its ``program_sha256`` stays that of the code as given."""
    try:
        record.model_dump_json()
        return record
    except PydanticSerializationError:  # a character UTF-8 cannot encode
        text = json.dumps(record.model_dump(mode="json"), ensure_ascii=False)
        return CallRecord.model_validate(json.loads(_SURROGATE.sub("\ufffd", text)))


def run_record(
    outcome: ExecutionOutcome,
    result: ValidationResult | None,
    request: ExecutionRequest,
    *,
    source: CallSource,
    clock: RunClock,
) -> CallRecord:
    """The call-log record of one run (see the module docstring)."""
    call_id = new_id()
    attempt_id = f"{call_id}.1"
    fetched = egress_of(outcome)
    egress = EgressCall.bounded(fetched)
    event = outcome.security_event
    fields: dict[str, Any] = {
        "trace_id": new_id(), "call_id": call_id, "depth": 0, "role": RUN_ROLE, "method": RUN_METHOD,
        "source": source, "args": bounded_json(request.args), "kwargs": bounded_json(request.kwargs),
        "started_at": clock.started, "duration_s": round(clock.seconds(), 6),
        **CallRecord.code_fields(request.code),
        "status": "ok" if outcome.ok else "error", "retriable": outcome.retriable,
        "attempt_id": attempt_id, "attempts": 1,
        "verdict": result.verdict if result else outcome.metadata.get("verdict"),
        "capabilities": [capability(c) for c in result.capabilities] if result else [],
        "policy_fingerprint": result.policy_fingerprint if result else outcome.metadata.get("policy_fingerprint"),
        "backend": outcome.backend or None, "protections": dict(outcome.protections),
        "usage": Usage(cpu_time_s=outcome.usage.cpu_time_s, peak_memory_mb=outcome.usage.peak_memory_mb,
                       source=outcome.usage.source, sandbox_duration_s=outcome.duration_s,
                       total_sandbox_duration_s=outcome.duration_s),
        "egress_requests": len(fetched), "egress": egress,
        "stdout": bounded(outcome.stdout, MAX_STDOUT_CHARS) if outcome.stdout else None,
        "input_files": manifest(request.files) or None, "output_files": manifest(outcome.files) or None,
        **{k: outcome.metadata[k] for k in _ENV_FIELDS if outcome.metadata.get(k) is not None},
    }  # fmt: skip
    if outcome.ok:
        return _encodable(CallRecord(**fields, value=bounded_json(outcome.value), attempt_stage="executed"))
    failure, stage = _failure_fields(outcome, result)
    message = bounded(outcome.error_message or failure["error_type"]) or ""
    violations = list(result.violations) if result is not None else []
    first = violations[0] if violations else None
    if stage == "validation" and first is not None:
        fields["validation_failure_type"] = first.violation_type
    at = now_utc()
    attempt_class = failure["failure_class"]
    if stage == "validation" and result is not None:  # a refusal's attempt: terminal or recoverable, as the lanes say
        terminal = result.verdict == "terminal" or any(str(v.classification).startswith("terminal") for v in violations)
        attempt_class = "terminal" if terminal else "recoverable"
    attempt = AttemptFailure(
        attempt_id=attempt_id, attempt_number=1, call_id=call_id, stage=stage,
        error_class=str(first.violation_type if stage == "validation" and first else
                        outcome.metadata.get("exception") or failure["error_type"])[:200],
        error_type=failure["error_type"], error_message=message, failure_class=attempt_class,
        violation_location=bounded(sort.location(first)) if stage == "validation" and first else None,
        timestamp=at, egress=egress, security_event=event,
    )  # fmt: skip
    events = [] if event is None else [
        CallSecurityEvent.of(event, attempt_id=attempt_id, attempt_number=1, role=RUN_ROLE, method=RUN_METHOD,
                             timestamp=at)
    ]  # fmt: skip
    return _encodable(CallRecord(
        **fields, **failure, error_message=message,
        attempt_stage="generated" if stage == "validation" else "rolled_back",
        latest_failure_stage=stage, latest_failure_class=attempt.error_class, latest_failure_message=message,
        attempt_failures=[attempt], security_events=events,
    ))  # fmt: skip
