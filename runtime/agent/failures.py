"""How the lifecycle sorts a failed execution into a lane (ADR 0016 section 1).

- extrinsic: the world failed (timeout, sandbox down, rate limit). Returned unchanged, never regenerated.
- adaptive: the input did not fit (``invalid_input``, ``parse_error``...). The code may be fine.
- intrinsic: a defect of the code. Anything not known to be extrinsic or adaptive.

There is one classification in sandforge: ``runtime.store.health`` owns it (the store may not import the
agent layer) and it is re-exported here, so a call's lane and its artifact's health always agree.
"""

from __future__ import annotations

from sandforge.runtime.store.health import (
    ADAPTIVE_ERROR_TYPES,
    EXTRINSIC_ERROR_TYPES,
    classify_failure,
    classify_outcome,
)
from sandforge.runtime.store.models import FailureClass
from sandforge.sandbox import ErrorType

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

__all__ = [
    "ADAPTIVE_ERROR_TYPES",
    "EXECUTION_FAILURES",
    "EXTRINSIC_ERROR_TYPES",
    "FailureClass",
    "classify_failure",
    "classify_outcome",
]
