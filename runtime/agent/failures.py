"""How the lifecycle sorts a failed execution into a lane (ADR 0016 section 1).

- extrinsic: the world failed (timeout, sandbox down, rate limit). Returned unchanged, never regenerated.
- adaptive: the input did not fit (``invalid_input``, ``parse_error``...). The code may be fine.
- intrinsic: a defect of the code. Anything not known to be extrinsic or adaptive.

The same sets as ``runtime.store.health`` uses for artifact health, so a call's lane and its artifact's
health agree.
"""

from __future__ import annotations

from enum import StrEnum

from sandbox import ErrorType


class FailureClass(StrEnum):
    EXTRINSIC = "extrinsic"
    ADAPTIVE = "adaptive"
    INTRINSIC = "intrinsic"


EXTRINSIC_ERROR_TYPES: frozenset[str] = frozenset(
    {
        "timeout",
        "sandbox_unavailable",
        "network_error",
        "connection_error",
        "rate_limit",
        "rate_limited",
        "provider",
        "provider_error",
        "service_unavailable",
        "dependency_unavailable",
    }
)
ADAPTIVE_ERROR_TYPES: frozenset[str] = frozenset(
    {"parse_error", "missing_input", "invalid_input", "invalid_format", "schema_mismatch", "not_found"}
)

#: Sandbox failures that mean the program itself misbehaved while running: the execution-repair lane.
EXECUTION_FAILURES: frozenset[ErrorType] = frozenset(
    {
        ErrorType.EXECUTION,
        ErrorType.INVALID_CODE,
        ErrorType.NON_SERIALIZABLE_RESULT,
        ErrorType.SANDBOX_VIOLATION,
        ErrorType.MEMORY_LIMIT,
        ErrorType.OUTPUT_LIMIT,
    }
)


def classify_failure(error_type: str | None) -> FailureClass:
    """Default class of an error type; unknown types are the code's fault (intrinsic)."""
    key = (error_type or "").strip().lower()
    if key in EXTRINSIC_ERROR_TYPES:
        return FailureClass.EXTRINSIC
    if key in ADAPTIVE_ERROR_TYPES:
        return FailureClass.ADAPTIVE
    return FailureClass.INTRINSIC
