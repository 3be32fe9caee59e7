"""Validate, then execute: the single path by which any program (fresh or persisted) reaches a sandbox.

:func:`approve` is the only maker of an :class:`Approval`, and :func:`execute_approved` runs nothing
without one for the very code it is asked to run. ``sandforge exec`` uses both through
:func:`guarded_execute`; the agent lifecycle calls them one by one, because it spends its trace budget
and decides its lanes between the two steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sandforge.runtime.guardrails import Policy, ValidationResult, validate
from sandforge.sandbox import BridgeHandler, ErrorType, ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.config import BackendName


class SandboxPort(Protocol):
    """What the gate needs of a sandbox: :class:`sandforge.sandbox.Sandbox`, or an in-memory one in tests."""

    def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome: ...


class AsyncSandboxPort(Protocol):
    """What the gate needs of a sandbox on an event loop: :class:`sandforge.sandbox.AsyncSandbox` (``sandbox``
    is the sync one it wraps: environments probe its interpreter)."""

    @property
    def sandbox(self) -> SandboxPort: ...

    async def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome: ...


@dataclass(frozen=True)
class Approval:
    """The policy approved ``code``: the ticket :func:`execute_approved` asks for. Made only by :func:`approve`."""

    code: str
    result: ValidationResult


class NotApproved(ValueError):
    """A request whose code is not the approved program reached :func:`execute_approved` (a host bug)."""


def approve(
    code: str, policy: Policy, *, adjust: Callable[[ValidationResult], ValidationResult] | None = None
) -> tuple[ValidationResult, Approval | None]:
    """Validate ``code``; the approval is None unless the verdict is ``approved``. ``adjust`` judges what the
    policy alone cannot (third-party imports against the program's declared environment: issue 19)."""
    result = validate(code, policy)
    if adjust is not None and result.violations:
        result = adjust(result)
    return result, (Approval(code, result) if result.verdict == "approved" else None)


def execute_approved(
    sandbox: SandboxPort,
    request: ExecutionRequest,
    approval: Approval,
    *,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
) -> ExecutionOutcome:
    """Run ``request`` in ``sandbox``: only the code ``approval`` was given for."""
    _require(approval, request)
    return sandbox.execute(request, backend=backend, bridge=bridge)


async def execute_approved_async(
    sandbox: AsyncSandboxPort,
    request: ExecutionRequest,
    approval: Approval,
    *,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
) -> ExecutionOutcome:
    """:func:`execute_approved`, awaited."""
    _require(approval, request)
    return await sandbox.execute(request, backend=backend, bridge=bridge)


def _require(approval: Approval, request: ExecutionRequest) -> None:
    if approval.result.verdict != "approved" or request.code != approval.code:
        raise NotApproved("the request's code is not the program the policy approved")


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
    sandbox: SandboxPort,
    request: ExecutionRequest,
    *,
    policy: Policy,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
) -> tuple[ExecutionOutcome, ValidationResult]:
    """Run ``request`` only if ``policy`` approves its code; the verdict travels in the outcome metadata."""
    result, approval = approve(request.code, policy)
    if approval is None:
        return rejection_outcome(result), result
    outcome = execute_approved(sandbox, request, approval, backend=backend, bridge=bridge)
    outcome.metadata.update(validation_metadata(result))
    return outcome, result
