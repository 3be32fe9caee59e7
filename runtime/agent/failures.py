"""How the lifecycle sorts a failed execution into a lane (ADR 0016 section 1).

- extrinsic: the world failed (timeout, sandbox down, rate limit). Returned unchanged, never regenerated.
- adaptive: the input did not fit (``invalid_input``, ``parse_error``...). The code may be fine.
- intrinsic: a defect of the code. Anything not known to be extrinsic or adaptive.

There is one classification in sandforge: ``runtime.store.kinds`` owns it (the store may not import the
agent layer) and it is re-exported here, so a call's lane and its artifact's health always agree.
"""

from __future__ import annotations

from sandforge.runtime.guardrails import ValidationResult, Violation
from sandforge.runtime.store.kinds import (
    ADAPTIVE_ERROR_TYPES,
    EXTRINSIC_ERROR_TYPES,
    FailureClass,
    classify_failure,
    classify_outcome,
)
from sandforge.sandbox import ErrorType, ExecutionOutcome

#: Sandbox failures that mean the program itself misbehaved while running: the execution-repair lane.
EXECUTION_FAILURES: frozenset[ErrorType] = frozenset(
    {
        ErrorType.EXECUTION,
        ErrorType.INVALID_CODE,
        ErrorType.NON_SERIALIZABLE_RESULT,
        ErrorType.SANDBOX_VIOLATION,
        ErrorType.INVALID_CONTRACT,
        ErrorType.MEMORY_LIMIT,
        ErrorType.OUTPUT_LIMIT,
        ErrorType.EGRESS_LIMIT,  # the program asked for more than the execution's egress budgets
        ErrorType.INVALID_FETCH,  # the program's fetch request was malformed
    }
)

#: Violations that only the caller's policy makes: the same program passes under a policy that grants what it
#: uses, so a refusal made of nothing else is EXTRINSIC (ADR 0012: it never degrades a stored artifact).
POLICY_DEPENDENT_VIOLATIONS = frozenset({"capability_not_granted"})


def policy_dependent(result: ValidationResult) -> bool:
    """Whether every violation of ``result`` is one only the caller's grants decide (see above)."""
    return bool(result.violations) and all(v.violation_type in POLICY_DEPENDENT_VIOLATIONS for v in result.violations)


#: Fetch failures that are the world's or the deployment's, never the program's (no lane regenerates them).
EGRESS_HOST_FAILURES = frozenset({"egress_denied", "missing_credentials", "network_error"})


def host_observed(kind: str, ex: ExecutionOutcome) -> bool:
    """Whether the broker answered a fetch of this execution with ``kind`` (its records are the host's)."""
    records = ex.metadata.get("egress")
    return isinstance(records, list) and any(isinstance(r, dict) and r.get("error") == kind for r in records)


def location(violation: Violation) -> str | None:
    """Where a violation is, as one line for feedback and records (None when the engine could not say)."""
    loc = violation.location
    if loc is None:
        return None
    text = f"line {loc.line}, column {loc.column}"
    source = loc.source_line.strip()
    return f"{text}: {source}" if source else text


__all__ = [
    "ADAPTIVE_ERROR_TYPES",
    "EGRESS_HOST_FAILURES",
    "EXECUTION_FAILURES",
    "EXTRINSIC_ERROR_TYPES",
    "POLICY_DEPENDENT_VIOLATIONS",
    "FailureClass",
    "classify_failure",
    "classify_outcome",
    "host_observed",
    "location",
    "policy_dependent",
]
