"""The lanes of ADR 0016: what a failed attempt spends, the feedback it queues, and when a lane gives up.

============================  ===============================  ============================================
failure                       lane / budget                    when exhausted (or not eligible)
============================  ===============================  ============================================
no usable program, syntax     generation_retry_budget          ``generation_retry_exhausted``
recoverable guardrail         guardrail_recovery_budget        ``guardrail_retry_exhausted`` (normalized at
                                                               depth 0)
terminal guardrail            none                             ``guardrail_violation`` at once
program raised / misbehaved   execution_repair_budget          the last execution error, non-retriable
(``egress_limit``,
``invalid_fetch`` too)
retriable ``Outcome.error``   fresh_outcome_repair_budget      ``outcome_repair_retry_exhausted``
(adaptive or intrinsic)
extrinsic failure             none                             returned unchanged (``network_error``:
(``network_error`` too)                                        retriable)
egress denied, no credential  none: terminal                   ``egress_denied``/``missing_credentials``,
                                                               not retriable, "will not help"
manifest refused (issue 19)   guardrail_recovery_budget        ``guardrail_retry_exhausted`` (the
(``invalid_dependency_                                         feedback lists what the policy allows)
manifest``, ``dependency_
policy_violation``)
no versions satisfy it        execution_repair_budget          ``dependency_resolution_failed``, not
(``dependency_resolution_                                      retriable
failed``)
install failed, still         none                             returned unchanged, retriable
being built (``dependency_                                     (extrinsic: never regenerated)
install_failed``,
``environment_preparing``)
provider API error            none (the SDK retried)           ``provider``, retriable as classified
============================  ===============================  ============================================

Each decision answers None (the lane retries: regenerate with the queued feedback) or a :class:`Failure`,
the call's error outcome. The lanes never build outcomes or records themselves (``runtime.agent.recording``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandforge.runtime.agent.attempt import Attempt
from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.calllog import (
    AttemptFailure,
    EgressCall,
    FailureStage,
    NestedCallSummary,
    bounded,
    now_utc,
)
from sandforge.runtime.agent.contracts import ContractViolation
from sandforge.runtime.agent.failures import (
    EGRESS_HOST_FAILURES,
    EXECUTION_FAILURES,
    FailureClass,
    classify_failure,
    classify_outcome,
    host_observed,
    location,
    policy_dependent,
)
from sandforge.runtime.agent.trace_budget import Stop
from sandforge.runtime.guardrails import ValidationResult, Violation
from sandforge.runtime.providers.base import AttemptFeedback, FeedbackKind
from sandforge.sandbox import ErrorType, ExecutionOutcome

#: What a top-level caller reads when guardrail recovery is exhausted (ADR 0016 section 7, ADR 0022).
GUARDRAIL_EXHAUSTED_MESSAGE = (
    "The tool could not produce a program that satisfies the runtime safety policy, so nothing was run. "
    "Details are in the call log."
)
#: Versioned name of the rule that replaced a depth-0 exhaustion message (recorded with the outcome).
NORMALIZATION_POLICY = "boundary-normalization/v1"
LANE_STAGE: dict[FeedbackKind, FailureStage] = {
    "generation": "generation",
    "guardrail": "validation",
    "execution": "execution",
    "outcome": "outcome_policy",
}


#: What the model reads after a fetch failure it caused (the execution-repair lane), beside the broker's words.
EGRESS_REPAIR = {
    "egress_limit": "The program went past one of this execution's egress budgets (named above, egress.limits.*), "
    "which no program can raise: make fewer or smaller requests (fetch only what the answer needs), or catch "
    "EgressLimit and return what was fetched.",
    "invalid_fetch": "The program's fetch request was malformed (see above): pass an absolute http(s) URL, a "
    "supported method, and string header names and values.",
}
#: Why a terminal fetch failure ends the call, for whoever reads it (a caller, or the model one level up).
EGRESS_TERMINAL = {
    "egress_denied": "Retrying another way will not help: what programs may reach is the deployment's egress "
    "policy (its grants and egress.allow entries), and only a change to that policy can allow this request.",
    "missing_credentials": "Retrying another way will not help: the policy injects a credential the host does "
    "not have; it must be provided on the host (the variable or file the message names).",
}


def egress_failure(kind: str, message: str, *, tool_error: bool = False) -> Failure:
    """A terminal denial or missing credential (not retriable; saying why retrying will not help), or a
    network error (retriable): extrinsic either way, so a stored artifact is never blamed for them."""
    extra: dict[str, Any] = {"failure_class": FailureClass.EXTRINSIC.value}
    if tool_error:
        extra["tool_error"] = True
    if kind == "network_error":
        return Failure(kind, message, True, extra)
    return Failure(kind, f"{message} {EGRESS_TERMINAL[kind]}", False, {**extra, "terminal": True})


@dataclass(frozen=True)
class Failure:
    """A call's answer when no lane retries: the error outcome's type, message and extra metadata."""

    error_type: str
    message: str
    retriable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def stopped(cls, stop: Stop) -> Failure:
        """The trace budget or the caller's deadline ended the call: host-observed, so extrinsic."""
        return cls(stop.error_type, stop.message, False, stop.metadata())


def violations_json(result: ValidationResult) -> list[dict[str, Any]]:
    return [v.model_dump(mode="json") for v in result.violations]


@dataclass
class Lanes:
    """One call's lanes: units spent, exhaustion, the failed attempts and the feedback for the next one."""

    budgets: Budgets
    depth: int
    generation: int = 0
    guardrail: int = 0
    execution: int = 0
    outcome: int = 0
    generation_exhausted: bool = False
    guardrail_exhausted: bool = False
    execution_exhausted: bool = False
    outcome_exhausted: bool = False
    failures: list[AttemptFailure] = field(default_factory=list)
    feedback: list[AttemptFeedback] = field(default_factory=list)
    #: the nested calls the last rolled-back attempt discarded (they go into its failure entry)
    discarded: list[NestedCallSummary] = field(default_factory=list)
    rollback_applied: bool = False
    validation_failure_type: str | None = None
    #: the requests the current attempt's execution had the host make (they go into its failure entry)
    fetched: list[EgressCall] = field(default_factory=list)

    def rolled_back(self, discarded: list[NestedCallSummary]) -> None:
        self.discarded = discarded
        self.rollback_applied = True

    def executed(self, egress: list[dict[str, Any]]) -> None:
        """The attempt's program ran and had the host make these requests (provenance records)."""
        self.fetched = EgressCall.bounded(egress)

    def _budget(self, lane: FeedbackKind) -> tuple[int, int]:
        b = self.budgets
        return {
            "generation": (self.generation, b.generation_retry_budget),
            "guardrail": (self.guardrail, b.guardrail_recovery_budget),
            "execution": (self.execution, b.execution_repair_budget),
            "outcome": (self.outcome, b.fresh_outcome_repair_budget),
        }[lane]

    def retry(
        self,
        at: Attempt,
        lane: FeedbackKind,
        error_class: str,
        error_type: str | None,
        message: str,
        *,
        code: str | None = None,
        failure_class: str | None = None,
        violation: Violation | None = None,
    ) -> bool:
        """Record the failed attempt; spend one unit of ``lane`` and queue feedback if any is left."""
        where = location(violation) if violation is not None else None
        self.failures.append(
            AttemptFailure(
                attempt_id=at.id, attempt_number=at.number, call_id=at.call_id, stage=LANE_STAGE[lane],
                error_class=error_class[:200], error_type=error_type, error_message=bounded(message) or "",
                failure_class=failure_class, violation_location=bounded(where),
                program_source=at.candidate.source if at.candidate else None, timestamp=now_utc(),
                discarded_nested_calls=self.discarded, egress=self.fetched,
                security_event=at.execution.security_event if at.execution is not None else None,
            )
        )  # fmt: skip
        self.discarded, self.fetched = [], []
        used, budget = self._budget(lane)
        if used >= budget:
            return False
        used += 1
        setattr(self, lane, used)
        self.feedback.append(
            AttemptFeedback(
                kind=lane, attempt_number=at.number, remaining_budget=budget - used,
                error_type=error_type if lane != "guardrail" else None,
                error_message=bounded(message, 2000) if lane != "guardrail" else None,
                failure_class=failure_class,
                violation_type=violation.violation_type if violation else None,
                violation_message=bounded(violation.message if violation else None, 2000),
                violation_location=where,
                required_correction=violation.required_correction if violation else None,
                previous_code=code,
            )
        )  # fmt: skip
        return True

    def _record_terminal(self, at: Attempt, violation: Violation, message: str) -> None:
        self.failures.append(
            AttemptFailure(
                attempt_id=at.id, attempt_number=at.number, call_id=at.call_id, stage="validation",
                error_class=str(violation.violation_type)[:200], error_type="guardrail_violation",
                error_message=bounded(message) or "", failure_class="terminal",
                violation_location=bounded(location(violation)),
                program_source=at.candidate.source if at.candidate else None, timestamp=now_utc(),
            )
        )  # fmt: skip

    # --- the decisions -----------------------------------------------------------------------------

    def generation_failure(self, at: Attempt, error_class: str, error_type: str, message: str,
                           code: str | None = None) -> Failure | None:  # fmt: skip
        """No usable program (bad provider output, syntax error): the generation lane."""
        if self.retry(at, "generation", error_class, error_type, message, code=code):
            return None
        self.generation_exhausted = True
        last = self.failures[-1].error_message
        message = f"the provider did not produce a usable program in {at.number} attempts ({last})"
        return Failure("generation_retry_exhausted", message)

    def validation_failure(self, at: Attempt, result: ValidationResult, code: str) -> Failure | None:
        """The policy refused the program: terminal at once, recoverable within the guardrail lane."""
        violations = list(result.violations)
        terminal = [v for v in violations if str(v.classification).startswith("terminal")]
        first = terminal[0] if terminal else violations[0]
        self.validation_failure_type = first.violation_type
        message = f"{first.violation_type}: {first.message}"
        if result.verdict == "terminal" or terminal:
            self._record_terminal(at, first, first.message)
            found: dict[str, Any] = {"violations": violations_json(result),
                                     "policy_fingerprint": result.policy_fingerprint}  # fmt: skip
            if policy_dependent(result):  # the caller's grants refused it, not a defect of the program
                found |= {"failure_class": FailureClass.EXTRINSIC.value, "terminal": True}
            return Failure("guardrail_violation", message, False, found)
        if self.retry(at, "guardrail", first.violation_type, "guardrail_violation", first.message, code=code,
                      failure_class="recoverable", violation=first):  # fmt: skip
            return None
        self.guardrail_exhausted = True
        where = location(first)
        last = {
            "violation_type": first.violation_type,
            "violation_message": first.message,
            "violation_location": where,
            "required_correction": first.required_correction,
            "violations": violations_json(result),
        }
        raw = f"guardrail_retry_exhausted after {at.number} attempts; last violation {message}" + (
            f" ({where})" if where else ""
        )
        top = self.depth == 0
        extra: dict[str, Any] = {"last_violation": last, "raw_error_message": raw, "normalized": top}
        if top:
            extra["normalization_policy"] = NORMALIZATION_POLICY
        return Failure("guardrail_retry_exhausted", GUARDRAIL_EXHAUSTED_MESSAGE if top else raw, False, extra)

    def execution_failure(self, at: Attempt, ex: ExecutionOutcome, code: str, *,
                          nested_extrinsic: frozenset[str] | set[str] = frozenset()) -> Failure | None:  # fmt: skip
        """The program ran and failed: its own ``Outcome.error``, a misbehaviour, or the world's fault.

        ``nested_extrinsic``: error types of this execution's nested calls that failed extrinsically (the
        host's own observation, :class:`~runtime.agent.execution.Executor`)."""
        error_type = ex.error_type.value if ex.error_type else "execution"
        message = ex.error_message or error_type
        if ex.error_type is ErrorType.TOOL_ERROR:
            return self._tool_error(at, ex, message, code, nested_extrinsic)
        if error_type in EGRESS_HOST_FAILURES:
            return egress_failure(error_type, message)
        if ex.error_type in EXECUTION_FAILURES:
            exception = ex.metadata.get("exception") or error_type
            line = ex.metadata.get("line")
            detail = f"{message} (line {line})" if line else message
            if error_type in EGRESS_REPAIR:
                detail = f"{detail}. {EGRESS_REPAIR[error_type]}"
            if self.retry(at, "execution", str(exception), error_type, detail, code=code,
                          failure_class=FailureClass.INTRINSIC.value):  # fmt: skip
                return None
            self.execution_exhausted = True
            return Failure(error_type, message, False, {"failure_class": FailureClass.INTRINSIC.value})
        # extrinsic (timeout, sandbox unavailable) or the host's own fault: unchanged, never regenerated
        cls = classify_failure(error_type)
        return Failure(error_type, message, ex.retriable, {"failure_class": cls.value})

    def _tool_error(self, at: Attempt, ex: ExecutionOutcome, message: str, code: str,
                    nested_extrinsic: frozenset[str] | set[str]) -> Failure | None:  # fmt: skip
        tool_type = str(ex.metadata.get("tool_error_type") or "tool_error")
        if tool_type in EGRESS_HOST_FAILURES and host_observed(tool_type, ex):
            # the program caught a fetch failure the host did answer it with, and says so: not a claim
            return egress_failure(tool_type, message, tool_error=True)
        if tool_type in nested_extrinsic:
            # a nested call of this execution failed extrinsically with this very type, as the host saw it:
            # returned unchanged, never repaired (ADR 0016), and never held against the program (ADR 0012)
            extra = {"failure_class": FailureClass.EXTRINSIC.value, "tool_error": True, "host_observed": "nested_call"}
            return Failure(tool_type, message, ex.retriable, extra)
        cls = classify_outcome(tool_type, tool_error=True, retriable=ex.retriable)  # never extrinsic
        if not ex.retriable or cls is FailureClass.EXTRINSIC:
            return Failure(tool_type, message, ex.retriable, {"failure_class": cls.value, "tool_error": True})
        if self.retry(at, "outcome", tool_type, tool_type, message, code=code, failure_class=cls.value):
            return None
        self.outcome_exhausted = True
        last_outcome = {
            "error_type": tool_type,
            "error_message": bounded(message),
            "failure_class": cls.value,
            "retriable": ex.retriable,
        }
        return Failure(
            "outcome_repair_retry_exhausted",
            f"the tool kept returning a retriable error ({tool_type}: {message})",
            False,
            {"failure_class": cls.value, "last_outcome": last_outcome},
        )

    def contract_violation(self, at: Attempt, violation: ContractViolation, code: str) -> Failure | None:
        """A result that does not match the deliverable: adaptive, outcome-repair lane, never committed."""
        adaptive = FailureClass.ADAPTIVE.value
        if self.retry(at, "outcome", "contract_violation", "contract_violation", violation.text, code=code,
                      failure_class=adaptive):  # fmt: skip
            return None
        self.outcome_exhausted = True
        return Failure("contract_violation", violation.text, True,
                       {"failure_class": adaptive, "contract_violation": violation.model_dump()})  # fmt: skip
