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

With telemetry on, a run is a ``sandforge.exec`` span whose children are the agent's stage spans:
``sandforge.validate``, ``sandforge.environment`` (when one is declared), ``sandforge.execute`` with its
``sandforge.sandbox.acquire`` and one client span per egress request (``runtime.agent.observe``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
from sandforge.runtime.gate import (
    Approval,
    AsyncSandboxPort,
    SandboxPort,
    approve,
    execute_approved,
    execute_approved_async,
    rejection_outcome,
    validation_metadata,
)
from sandforge.runtime.guardrails import Policy, ValidationResult, cached_verdict
from sandforge.runtime.guardrails.dependencies import judge_imports, undeclared_violation
from sandforge.runtime.telemetry import Telemetry
from sandforge.runtime.telemetry import current as telemetry
from sandforge.sandbox import BridgeHandler, EnvironmentMount, ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.config import BackendName

if TYPE_CHECKING:
    from sandforge.runtime.environments.records import PreparedEnvironment

__all__ = [
    "Planned",
    "environment_failure_outcome",
    "execute_program",
    "execute_program_async",
    "plan_program",
    "plans_quickly",
    "read_manifest",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """A program the policy approved, with its environment found or built: what is left is running it."""

    request: ExecutionRequest
    approval: Approval
    result: ValidationResult
    prepared: PreparedEnvironment | None

    def finish(self, outcome: ExecutionOutcome) -> tuple[ExecutionOutcome, ValidationResult]:
        """The outcome of the run with the verdict and the environment's call-log fields in its metadata."""
        outcome.metadata.update(validation_metadata(self.result))
        if self.prepared is not None:
            outcome.metadata.update(self.prepared.log_fields())
        return outcome, self.result


#: What a refused program ends as: its outcome (nothing ran) and the verdict (None: the manifest was refused).
Refused = tuple[ExecutionOutcome, ValidationResult | None]


def plan_program(
    sandbox: SandboxPort,
    request: ExecutionRequest,
    *,
    policy: Policy,
    backend: BackendName | None = None,
    environments: Environments | None = None,
    manifest: Manifest | None = None,
) -> Planned | Refused:
    """Steps 1-3 of the module docstring: the manifest (``manifest``: already read by the caller), the
    policy's verdict, the environment (which may be built: minutes, on a thread). Nothing runs; a refusal is
    a typed outcome."""
    if manifest is None:
        read = read_manifest(request, policy)
        if not isinstance(read, Manifest):
            return read
        manifest = read
    pending: list[str] = []
    tel = telemetry()
    with observe.stage(tel, "validate") as span:
        result, approval = approve(request.code, policy, adjust=_judged(manifest, policy, pending))
        if tel.enabled:
            observe.validated(span, result)
    if approval is None:
        return rejection_outcome(result), result
    prepared: PreparedEnvironment | None = None
    if manifest:  # a program that declares nothing loads no environment record (issue 39)
        from sandforge.runtime.environments.records import PreparedEnvironment

        with observe.stage(tel, "environment") as span:
            found = _prepare(sandbox, manifest, policy, backend, environments)
            if tel.enabled:
                observe.environment_prepared(span, found if isinstance(found, PreparedEnvironment) else None)
        if isinstance(found, ExecutionOutcome):  # its own violations (the fix) stay; the verdict's fill the rest
            for key, value in validation_metadata(result).items():
                found.metadata.setdefault(key, value)
            return found, result
        prepared = found
        mount = _mount(prepared, manifest, pending, policy, result)
        if not isinstance(mount, EnvironmentMount):
            return mount
        request = request.model_copy(update={"environment": mount})
    return Planned(request, approval, result, prepared)


def read_manifest(request: ExecutionRequest, policy: Policy) -> Manifest | Refused:
    """Step 1: the program's manifest, or its refusal (a typed outcome; nothing validated yet)."""
    try:
        return manifest_for(request.code, [], policy.dependencies)
    except EnvironmentFailure as exc:
        return environment_failure_outcome(exc, policy), None


def plans_quickly(request: ExecutionRequest, policy: Policy, read: Manifest | Refused | None = None) -> bool:
    """Would :func:`plan_program` return at once (no environment to prepare, the verdict already cached)? Then
    an event loop may plan it itself; otherwise planning is a blocking call (a cold validation of a large
    program takes tens of milliseconds, an environment build minutes). ``read``: the manifest already read."""
    read = read_manifest(request, policy) if read is None else read
    if not isinstance(read, Manifest):
        return True  # refused at once
    return not read and cached_verdict(request.code, policy) is not None


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
    module docstring). The verdict (None when the manifest was refused first) travels in the metadata."""
    tel = telemetry()
    with _exec_span(tel, backend) as ended:
        planned = plan_program(sandbox, request, policy=policy, backend=backend, environments=environments)
        if not isinstance(planned, Planned):
            return ended(planned)
        with _execute_span(tel, backend) as executed:
            outcome = executed(execute_approved(sandbox, planned.request, planned.approval, backend=backend,
                                                bridge=observe.traced_bridge(tel, bridge)))  # fmt: skip
        return ended(planned.finish(outcome))


async def execute_program_async(
    sandbox: AsyncSandboxPort,
    request: ExecutionRequest,
    *,
    policy: Policy,
    backend: BackendName | None = None,
    bridge: BridgeHandler | None = None,
    environments: Environments | None = None,
) -> tuple[ExecutionOutcome, ValidationResult | None]:
    """:func:`execute_program` on an event loop (``POST /v1/exec``): planned on the loop when that is instant
    (:func:`plans_quickly`), on a thread otherwise; the execution awaited (``AsyncSandbox``: no thread waits
    for its output)."""
    tel = telemetry()
    with _exec_span(tel, backend) as ended:  # a thread planning it runs in a copy of this context: its child
        read = read_manifest(request, policy)  # read once: it decides where planning runs, then feeds it
        if not isinstance(read, Manifest):
            return ended(read)
        plan = functools.partial(plan_program, sandbox.sandbox, request, policy=policy, backend=backend,
                                 environments=environments, manifest=read)  # fmt: skip
        import asyncio  # loaded with the async API: a sync run (``sandforge exec``) needs none of it

        planned = plan() if plans_quickly(request, policy, read) else await asyncio.to_thread(plan)
        if not isinstance(planned, Planned):
            return ended(planned)
        with _execute_span(tel, backend) as executed:
            outcome = executed(
                await execute_approved_async(
                    sandbox,
                    planned.request,
                    planned.approval,
                    backend=backend,
                    bridge=observe.traced_bridge(tel, bridge),
                )
            )
        return ended(planned.finish(outcome))


#: What a run answers: its outcome and the verdict (None: the manifest was refused before any).
Answer = tuple[ExecutionOutcome, ValidationResult | None]
Ended = Callable[[Answer], Answer]


@contextmanager
def _exec_span(tel: Telemetry, backend: BackendName | None) -> Iterator[Ended]:
    """The run's ``sandforge.exec`` span; the function it gives puts the answer on it (and passes it on)."""
    if not tel.enabled:
        yield _unchanged
        return
    with observe.exec_span(tel, backend) as span:

        def ended(answer: Answer) -> Answer:
            observe.exec_ended(tel, span, answer[0], answer[1])
            return answer

        yield ended


def _unchanged(answer: Answer) -> Answer:
    return answer


@contextmanager
def _execute_span(
    tel: Telemetry, backend: BackendName | None
) -> Iterator[Callable[[ExecutionOutcome], ExecutionOutcome]]:
    """The ``sandforge.execute`` span (and its acquisition child) around one execution, as an attempt's."""
    if not tel.enabled:
        yield _same_outcome
        return
    with observe.stage(tel, "execute", {"sandforge.backend": backend}) as span:
        started_ns = time.time_ns()

        def executed(outcome: ExecutionOutcome) -> ExecutionOutcome:
            observe.executed(tel, span, outcome, started_ns=started_ns)
            return outcome

        yield executed


def _same_outcome(outcome: ExecutionOutcome) -> ExecutionOutcome:
    return outcome


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


def _mount(
    prepared: PreparedEnvironment, manifest: Manifest, pending: list[str], policy: Policy, result: ValidationResult
) -> EnvironmentMount | Refused:
    """The request's environment field; refused when the program imports a module no declared distribution
    provides, or when the environment is one a request cannot name (a typed outcome: nothing runs)."""
    provided = declared_modules(prepared, manifest)
    missing = [module for module in pending if module not in provided]
    if missing:
        violation = undeclared_violation(missing, policy.dependencies)
        refused = result.model_copy(update={"verdict": "recoverable", "violations": [violation]})
        return rejection_outcome(refused), refused
    try:
        return mount_of(prepared, manifest)
    except EnvironmentFailure as exc:
        return environment_failure_outcome(exc, policy), result


def environment_failure_outcome(exc: EnvironmentFailure, policy: Policy) -> ExecutionOutcome:
    """A failure to prepare the program's environment as a typed outcome (nothing ran): the kind is the
    error type, retriable as its lane says; the recoverable kinds carry the fix as a violation."""
    metadata: dict[str, object] = {"environment_failure": {"kind": exc.kind.value, "reason": exc.reason}}
    if exc.kind in RECOVERABLE:
        metadata |= validation_metadata(failure_result(exc, policy))
    return ExecutionOutcome.failure(exc.kind, str(exc), retriable=exc.lane.retriable, metadata=metadata)
