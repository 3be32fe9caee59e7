"""Validate, then execute: the single path by which any program (fresh or persisted) reaches a sandbox."""

from __future__ import annotations

from typing import Any

from sandforge.runtime.guardrails import Policy, ValidationResult, validate
from sandforge.sandbox import BridgeHandler, ErrorType, ExecutionOutcome, ExecutionRequest, Sandbox
from sandforge.sandbox.config import BackendName


def rejection_outcome(result: ValidationResult) -> ExecutionOutcome:
    """The outcome of a program the policy refused: typed, with every violation in metadata, never run."""
    syntax_only = all(v.violation_type == "invalid_code" for v in result.violations)
    first = result.violations[0]
    more = f" (+{len(result.violations) - 1} more)" if len(result.violations) > 1 else ""
    return ExecutionOutcome.failure(
        ErrorType.INVALID_CODE if syntax_only else ErrorType.GUARDRAIL_VIOLATION,
        f"{first.violation_type}: {first.message}{more}",
        retriable=False,
        metadata=validation_metadata(result),
    )


def validation_metadata(result: ValidationResult) -> dict[str, Any]:
    return {
        "verdict": result.verdict,
        "violations": [v.model_dump(mode="json") for v in result.violations],
        "capabilities": sorted({c.tag for c in result.capabilities}),
        "policy_fingerprint": result.policy_fingerprint,
    }


def guarded_execute(
    sandbox: Sandbox,
    request: ExecutionRequest,
    *,
    policy: Policy,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
) -> tuple[ExecutionOutcome, ValidationResult]:
    """Run ``request`` only if ``policy`` approves its code; the verdict travels in the outcome metadata."""
    result = validate(request.code, policy)
    if result.verdict != "approved":
        return rejection_outcome(result), result
    outcome = sandbox.execute(request, backend=backend, bridge=bridge)
    outcome.metadata.update(validation_metadata(result))
    return outcome, result
