"""What a call reports: its :class:`Outcome` (with diagnostics in ``metadata``) and its call-log record.

A :class:`Recorder` reads the parts of one call (attempt, lanes, program seam, executor, trace meter) and
never changes them; the lifecycle asks it for the outcome when the loop ends and for the record after.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from sandforge.runtime.agent.attempt import Attempt
from sandforge.runtime.agent.calllog import (
    MAX_STDOUT_CHARS,
    STORE_FIELDS,
    CallRecord,
    CallSecurityEvent,
    EgressCall,
    Usage,
    bounded,
    bounded_json,
    capability,
)
from sandforge.runtime.agent.egress import egress_of
from sandforge.runtime.agent.env import CallSpec
from sandforge.runtime.agent.execution import Executor
from sandforge.runtime.agent.failures import classify_outcome
from sandforge.runtime.agent.lanes import Failure, Lanes
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.seam import ProgramSeam
from sandforge.runtime.agent.trace_budget import TraceMeter
from sandforge.runtime.files.transfer import manifest
from sandforge.sandbox import ExecutionOutcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recorder:
    """Builds one call's outcome and record from its parts (read only)."""

    spec: CallSpec
    provider_name: str
    at: Attempt
    lanes: Lanes
    seam: ProgramSeam
    executor: Executor
    meter: TraceMeter

    # --- the outcome -------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        lanes, ex, vr = self.lanes, self.at.execution, self.at.validation
        meta: dict[str, Any] = {
            "call_id": self.spec.call_id,
            "trace_id": self.spec.trace_id,
            "depth": self.spec.depth,
            "attempts": self.at.number,
            "provider_calls": self.seam.provider_calls,
            "program_source": self.at.candidate.source if self.at.candidate else None,
            "rollback_applied": lanes.rollback_applied,
            "retry_feedback_injected": bool(lanes.feedback),
            "guardrail_recovery_attempts": lanes.guardrail,
            "execution_repair_attempts": lanes.execution,
            "outcome_repair_attempts": lanes.outcome,
            "generation_retry_attempts": lanes.generation,
        }
        if events := self.security_events():
            meta["security_events"] = [e.model_dump(mode="json") for e in events]
        if lanes.failures:
            last = lanes.failures[-1]
            meta["attempt_failures"] = [f.model_dump(mode="json") for f in lanes.failures]
            meta["latest_failure_stage"] = last.stage
            meta["latest_failure_class"] = last.error_class
            meta["latest_failure_message"] = last.error_message
        if ex is not None:
            meta["backend"] = ex.backend
            if ex.stdout:
                meta["stdout"] = bounded(ex.stdout, MAX_STDOUT_CHARS)
            if fetched := egress_of(ex):  # provenance written by the host: the sources of fetched data
                meta["egress"] = fetched
            if isinstance(nested := ex.metadata.get("egress_nested"), list) and nested:
                meta["egress_nested"] = nested  # what its nested calls fetched (their records have it too)
        if vr is not None:
            meta["capabilities"] = sorted({c.tag for c in vr.capabilities})
            meta["policy_fingerprint"] = vr.policy_fingerprint
        return meta

    def security_events(self) -> list[CallSecurityEvent]:
        """Every security event of the call, in order: each attempt whose execution ended on one (the lanes
        record every failed attempt, so its failure entry holds it) and the nested calls its rolled-back
        attempts discarded (their own records were discarded with them)."""
        found: list[CallSecurityEvent] = []
        for failure in self.lanes.failures:
            for nested in failure.discarded_nested_calls:
                found.extend(nested.security_events)
            if failure.security_event is not None:
                found.append(CallSecurityEvent.of(
                    failure.security_event, attempt_id=failure.attempt_id, attempt_number=failure.attempt_number,
                    role=self.spec.role, method=self.spec.method, timestamp=failure.timestamp,
                ))  # fmt: skip
        return found

    def ok(self, ex: ExecutionOutcome) -> Outcome:
        return Outcome(status="ok", value=ex.value, tool_role=self.spec.role, method_name=self.spec.method,
                       metadata=self.metadata(),
                       files=ex.files if self.spec.depth == 0 or self.spec.returns_files else {})  # fmt: skip

    def error(self, failure: Failure) -> Outcome:
        meta = self.metadata()
        meta.update(failure.extra)
        if meta.get("failure_class") is None:  # every failure has one class: outcome, call log and store agree
            meta["failure_class"] = classify_outcome(
                failure.error_type, tool_error=bool(meta.get("tool_error")), retriable=failure.retriable
            ).value
        return Outcome(
            status="error", error_type=failure.error_type, error_message=failure.message,
            retriable=failure.retriable, tool_role=self.spec.role, method_name=self.spec.method, metadata=meta,
        )  # fmt: skip

    # --- the record --------------------------------------------------------------------------------

    def record(self, outcome: Outcome, started: datetime, duration: float) -> CallRecord:
        fields: dict[str, Any] = {
            **self._identity(started, duration),
            **self._program(),
            **self._outcome(outcome),
            **self._lanes(),
            **self._execution(),
            **self._files(outcome),
        }
        try:
            return CallRecord(**fields, **self._store_fields(outcome))
        except ValidationError:
            log.exception("program store proposed invalid call-log fields; logging the call without them")
            return CallRecord(**fields)

    def _identity(self, started: datetime, duration: float) -> dict[str, Any]:
        s = self.spec
        return dict(
            trace_id=s.trace_id, call_id=s.call_id, parent_call_id=s.parent_call_id, depth=s.depth, role=s.role,
            method=s.method, args=bounded_json(s.args), kwargs=bounded_json(s.kwargs), started_at=started,
            duration_s=round(duration, 6),
        )  # fmt: skip

    def _program(self) -> dict[str, Any]:
        cand, vr = self.at.candidate, self.at.validation
        return dict(
            program_source=cand.source if cand else None,
            **CallRecord.code_fields(cand.code if cand else None),
            dependencies=list(cand.dependencies) if cand else [],
            provider=(cand.provider if cand else None) or self.provider_name,
            model=cand.model if cand else None,
            provider_calls=self.seam.provider_calls,
            verdict=vr.verdict if vr else None,
            capabilities=[capability(c) for c in vr.capabilities] if vr else [],
            policy_fingerprint=vr.policy_fingerprint if vr else None,
        )

    @staticmethod
    def _outcome(outcome: Outcome) -> dict[str, Any]:
        return dict(
            status=outcome.status,
            value=bounded_json(outcome.value),
            error_type=outcome.error_type,
            error_message=bounded(outcome.error_message),
            retriable=outcome.retriable,
            failure_class=outcome.metadata.get("failure_class"),
            normalization_policy=outcome.metadata.get("normalization_policy"),
            tool_error=bool(outcome.metadata.get("tool_error")),
        )

    def _lanes(self) -> dict[str, Any]:
        lanes, at = self.lanes, self.at
        last = lanes.failures[-1] if lanes.failures else None
        return dict(
            attempt_id=at.id,
            attempts=at.number,
            attempt_stage=at.stage,
            validation_failure_type=lanes.validation_failure_type,
            rollback_applied=lanes.rollback_applied,
            retry_feedback_injected=bool(lanes.feedback),
            generation_retry_attempts=lanes.generation,
            generation_retry_exhausted=lanes.generation_exhausted,
            guardrail_recovery_attempts=lanes.guardrail,
            guardrail_retry_exhausted=lanes.guardrail_exhausted,
            execution_repair_attempts=lanes.execution,
            execution_repair_exhausted=lanes.execution_exhausted,
            outcome_repair_attempts=lanes.outcome,
            outcome_repair_triggered=lanes.outcome > 0,
            outcome_repair_retry_exhausted=lanes.outcome_exhausted,
            latest_failure_stage=last.stage if last else None,
            latest_failure_class=last.error_class if last else None,
            latest_failure_message=last.error_message if last else None,
            attempt_failures=list(lanes.failures),
            security_events=self.security_events(),
        )

    def _execution(self) -> dict[str, Any]:
        ex, tally = self.at.execution, self.executor
        totals = {"total_sandbox_duration_s": round(tally.sandbox_seconds, 6),
                  "bridge_duration_s": round(tally.bridge_seconds, 6),
                  "fetch_duration_s": round(tally.fetch_seconds, 6)}  # fmt: skip
        usage = Usage(**totals)
        if ex is not None:
            usage = Usage(
                cpu_time_s=ex.usage.cpu_time_s, peak_memory_mb=ex.usage.peak_memory_mb, source=ex.usage.source,
                sandbox_duration_s=ex.duration_s, **totals,
            )  # fmt: skip
        fetched = egress_of(ex)
        return dict(
            backend=(ex.backend or None) if ex else None,
            protections=dict(ex.protections) if ex else {},
            usage=usage,
            nested_calls=tally.nested_calls,
            egress_requests=len(fetched),
            egress=EgressCall.bounded(fetched),
            stdout=bounded(ex.stdout, MAX_STDOUT_CHARS) if ex and ex.stdout else None,
            trace_usage=self.meter.usage(),
            **tally.env_fields,
        )

    def _files(self, outcome: Outcome) -> dict[str, Any]:
        """Names, sizes and sha256 of the call's input files and of the outputs it committed (never contents)."""
        return dict(input_files=manifest(self.spec.files) if self.spec.files else None,
                    output_files=manifest(outcome.files) if outcome.files else None)  # fmt: skip

    def _store_fields(self, outcome: Outcome) -> dict[str, Any]:
        proposed: dict[str, Any] = {}
        seam = self.seam
        if seam.plan is not None:
            proposed.update(seam.plan.log_fields)
        if seam.extras is not None:
            proposed.update(seam.extras.log_fields)
        unknown = set(proposed) - STORE_FIELDS
        if unknown:
            log.warning("program store proposed unknown call-log fields %s; ignored", sorted(unknown))
        fields = {k: v for k, v in proposed.items() if k in STORE_FIELDS}
        fields["repair_attempted"] = seam.repair_attempted
        fields["repair_succeeded"] = (
            outcome.status == "ok" and self.at.candidate is not None and self.at.candidate.source == "repaired"
        )
        return fields
