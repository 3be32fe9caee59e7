"""One program run without a model (``sandforge exec``, ``POST /v1/exec``, the MCP ``exec`` tool): validated
by the policy and run with the environment it declares, as the agent's lifecycle does for each attempt.

The steps and their answers (all typed outcomes, nothing ran unless the last step is reached):

1. the manifest (its PEP 723 block), its declared names checked against the policy's ``dependencies:``
   section: ``invalid_dependency_manifest`` / ``dependency_policy_violation``, with the fix in
   ``metadata["violations"]``;
2. the policy: a third-party import with no manifest is ``undeclared_import`` ("declare it"), any other
   refusal as before (``guardrail_violation``);
3. the environment, built or found for the interpreter the backend runs programs on: the environment kinds
   (``dependency_resolution_failed``, ``dependency_install_failed``, ``environment_preparing``); a module
   the program imports that no declared distribution provides is ``undeclared_import``;
4. the sandbox, with the environment mounted read-only; ``metadata`` gains the call log's environment
   fields (``env_id``, ``environment_cache_hit``, ``env_prepare_ms``...).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sandforge.runtime.agent import observe
from sandforge.runtime.agent.environment import (
    Environments,
    declared_modules,
    default_environments,
    failure_result,
    manifest_for,
    mount_of,
)
from sandforge.runtime.environments.errors import RECOVERABLE, DependencyInstallFailed, EnvironmentFailure
from sandforge.runtime.environments.manifest import Manifest
from sandforge.runtime.environments.records import PreparedEnvironment
from sandforge.runtime.gate import SandboxPort, approve, execute_approved, rejection_outcome, validation_metadata
from sandforge.runtime.guardrails import Policy, ValidationResult
from sandforge.runtime.guardrails.dependencies import judge_imports, undeclared_violation
from sandforge.runtime.telemetry import Telemetry
from sandforge.runtime.telemetry import current as telemetry
from sandforge.sandbox import BridgeHandler, ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.config import BackendName

__all__ = ["environment_failure_outcome", "execute_program"]

log = logging.getLogger(__name__)


def execute_program(
    sandbox: SandboxPort,
    request: ExecutionRequest,
    *,
    policy: Policy,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
    environments: Environments | None = None,
) -> tuple[ExecutionOutcome, ValidationResult | None]:
    """Run ``request`` if ``policy`` approves its code, with the environment its code declares (see the
    module docstring). The verdict (None when the manifest was refused first) travels in the metadata.

    With telemetry on, the run is a ``sandforge.exec`` span with the agent's stage spans as children
    (validate, environment, execute with its sandbox acquisition, one client span per egress request)."""
    tel = telemetry()
    if not tel.enabled:
        return _execute(sandbox, request, policy, backend, bridge, environments, tel)
    with observe.exec_span(tel, backend) as span:
        outcome, result = _execute(sandbox, request, policy, backend, observe.traced_bridge(tel, bridge),
                                   environments, tel)  # fmt: skip
        observe.exec_ended(tel, span, outcome, result)
    return outcome, result


def _execute(
    sandbox: SandboxPort,
    request: ExecutionRequest,
    policy: Policy,
    backend: BackendName | None,
    bridge: BridgeHandler | None,
    environments: Environments | None,
    tel: Telemetry,
) -> tuple[ExecutionOutcome, ValidationResult | None]:
    try:
        manifest = manifest_for(request.code, [], policy.dependencies)
    except EnvironmentFailure as exc:
        return environment_failure_outcome(exc, policy), None
    pending: list[str] = []
    with observe.stage(tel, "validate") as span:
        result, approval = approve(request.code, policy, adjust=_judged(manifest, policy, pending))
        if tel.enabled:
            observe.validated(span, result)
    if approval is None:
        return rejection_outcome(result), result
    prepared: PreparedEnvironment | None = None
    if manifest:
        found = _environment(sandbox, manifest, policy, backend, environments, tel, result, pending)
        if isinstance(found, tuple):
            return found
        prepared = found
        request = request.model_copy(update={"environment": mount_of(prepared, manifest)})
    with observe.stage(tel, "execute", {"sandforge.backend": backend}) as span:
        started_ns = time.time_ns()
        outcome = execute_approved(sandbox, request, approval, backend=backend, bridge=bridge)
        if tel.enabled:
            observe.executed(tel, span, started_ns=started_ns, backend=outcome.backend, ok=outcome.ok,
                             error_type=outcome.error_type.value if outcome.error_type else None,
                             duration_s=outcome.duration_s, metadata=outcome.metadata)  # fmt: skip
    outcome.metadata.update(validation_metadata(result))
    if prepared is not None:
        outcome.metadata.update(prepared.log_fields())
    return outcome, result


def _environment(
    sandbox: SandboxPort,
    manifest: Manifest,
    policy: Policy,
    backend: BackendName | None,
    environments: Environments | None,
    tel: Telemetry,
    result: ValidationResult,
    pending: list[str],
) -> PreparedEnvironment | tuple[ExecutionOutcome, ValidationResult]:
    """The environment the program declares, or the answer when it cannot run with it (nothing ran)."""
    with observe.stage(tel, "environment") as span:
        found = _prepare(sandbox, manifest, policy, backend, environments)
        if tel.enabled:
            observe.environment_prepared(span, found if isinstance(found, PreparedEnvironment) else None)
    if isinstance(found, ExecutionOutcome):  # its own violations (the fix) stay; the verdict's fill the rest
        for key, value in validation_metadata(result).items():
            found.metadata.setdefault(key, value)
        return found, result
    provided = declared_modules(found, manifest)
    missing = [module for module in pending if module not in provided]
    if missing:
        violation = undeclared_violation(missing, policy.dependencies)
        refused = result.model_copy(update={"verdict": "recoverable", "violations": [violation]})
        return rejection_outcome(refused), refused
    return found


def _judged(manifest: Manifest, policy: Policy, pending: list[str]) -> Callable[[ValidationResult], ValidationResult]:
    """Third-party imports judged against the manifest; the ones waiting for its environment go to ``pending``."""

    def adjust(result: ValidationResult) -> ValidationResult:
        judged, waiting = judge_imports(result, policy.dependencies, declared=bool(manifest), provided=None)
        pending.extend(waiting)
        return judged

    return adjust


def _prepare(
    sandbox: SandboxPort,
    manifest: Manifest,
    policy: Policy,
    backend: BackendName | None,
    environments: Environments | None,
) -> PreparedEnvironment | ExecutionOutcome:
    envs = environments or default_environments()
    try:
        target = envs.target(sandbox, backend)
        return envs.prepare(manifest, policy.dependencies, target)
    except EnvironmentFailure as exc:
        return environment_failure_outcome(exc, policy)
    except Exception as exc:  # a probe that could not run (the engine down): the world's fault, as in the agent
        log.exception("preparing the environment failed")
        failure = DependencyInstallFailed(f"the environment could not be prepared: {exc}"[:500])
        return environment_failure_outcome(failure, policy)


def environment_failure_outcome(exc: EnvironmentFailure, policy: Policy) -> ExecutionOutcome:
    """A failure to prepare the program's environment as a typed outcome (nothing ran): the kind is the
    error type, retriable as its lane says; the recoverable kinds carry the fix as a violation."""
    metadata: dict[str, object] = {"environment_failure": {"kind": exc.kind.value, "reason": exc.reason}}
    if exc.kind in RECOVERABLE:
        metadata |= validation_metadata(failure_result(exc, policy))
    return ExecutionOutcome.failure(exc.kind, str(exc), retriable=exc.lane.retriable, metadata=metadata)
