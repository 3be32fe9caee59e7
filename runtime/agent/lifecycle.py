"""The lifecycle of one dynamic call (ADR 0016): obtain -> validate -> execute -> commit, with bounded lanes.

Each attempt runs in its own :class:`~runtime.agent.state.Transaction`; only a successful attempt commits.
A failed attempt is rolled back, recorded in ``attempt_failures`` and, when its lane has budget left
(``runtime.agent.lanes``), followed by a regeneration that carries structured feedback.

A call sees only its port (``runtime.agent.env``: an immutable :class:`CallEnv` and :class:`CallSpec`),
never the workspace. Its parts each own one concern: :class:`Attempt` (how far the current attempt got),
:class:`Lanes` (retries and their feedback), :class:`ProgramSeam` (where programs come from),
:class:`Executor` (the sandbox, through ``runtime.gate``, and the program's nested calls) and
:class:`Recorder` (the outcome and the call-log record).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sandforge.runtime.agent import observe
from sandforge.runtime.agent.attempt import Attempt
from sandforge.runtime.agent.calllog import CallRecord, now_utc
from sandforge.runtime.agent.contracts import ContractViolation, check_deliverable
from sandforge.runtime.agent.egress import egress_of
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.environment import (
    declared_modules,
    default_environments,
    failure_result,
    manifest_for,
    mount_of,
)
from sandforge.runtime.agent.execution import Executor
from sandforge.runtime.agent.lanes import GUARDRAIL_EXHAUSTED_MESSAGE, NORMALIZATION_POLICY, Failure, Lanes
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.recording import Recorder
from sandforge.runtime.agent.requests import generation_request, syntax_problem
from sandforge.runtime.agent.seam import ProgramSeam
from sandforge.runtime.agent.source import ProgramCandidate
from sandforge.runtime.agent.state import StagedRecord, Transaction
from sandforge.runtime.agent.trace_budget import BudgetStop, TraceMeter
from sandforge.runtime.environments.errors import LIFECYCLE, RECOVERABLE, EnvironmentFailure
from sandforge.runtime.environments.manifest import Manifest
from sandforge.runtime.gate import Approval, approve
from sandforge.runtime.guardrails import ValidationResult
from sandforge.runtime.guardrails.dependencies import judge_imports, undeclared_violation
from sandforge.runtime.providers.base import InvalidProviderOutput, ProviderError
from sandforge.runtime.telemetry import current as telemetry
from sandforge.sandbox import EnvironmentMount, ExecutionOutcome

__all__ = ["GUARDRAIL_EXHAUSTED_MESSAGE", "NORMALIZATION_POLICY", "CallEnv", "CallRun", "CallSpec"]

log = logging.getLogger(__name__)

#: A step's answer: go on with this value, end the call with a Failure, or None (a lane retries).
Step = Failure | None
#: A prepared environment step's value: the mount (None: the program declares nothing).
Ready = tuple[EnvironmentMount | None]


@dataclass(frozen=True)
class CallRun:
    """One logical call: every attempt, its lanes and its record. ``run`` never raises for tool failures.

    ``meter`` is the trace's account, shared with every nested call (:meth:`top` opens it), and
    ``parent_txn`` the attempt of the program that made a nested call (None at the top level)."""

    env: CallEnv
    spec: CallSpec
    meter: TraceMeter
    parent_txn: Transaction | None = None
    at: Attempt = field(init=False)
    lanes: Lanes = field(init=False)
    seam: ProgramSeam = field(init=False)
    executor: Executor = field(init=False)
    recorder: Recorder = field(init=False)
    #: when :meth:`run` began: wall clock (the record's ``started_at``) and monotonic (its duration)
    started: tuple[datetime, float] = field(init=False)

    def __post_init__(self) -> None:
        init = object.__setattr__  # the parts are made once; the run changes them, never rebinds them
        init(self, "at", Attempt(self.spec.call_id))
        init(self, "lanes", Lanes(self.env.budgets, self.spec.depth))
        init(self, "seam", ProgramSeam(self.env, self.spec, self.meter))
        init(self, "executor", Executor(self.env, self.spec, self.meter, self._run_nested))
        init(self, "recorder", Recorder(self.spec, self.env.provider_name, self.at, self.lanes, self.seam,
                                        self.executor, self.meter))  # fmt: skip

    @classmethod
    def top(cls, env: CallEnv, spec: CallSpec) -> CallRun:
        """A top-level call: it opens the trace's account, which its nested calls share."""
        return cls(env, spec, TraceMeter(env.trace_budget))

    def _run_nested(self, spec: CallSpec, scope: Transaction) -> Outcome:
        return CallRun(self.env, spec, self.meter, parent_txn=scope).run()

    def run(self) -> Outcome:
        object.__setattr__(self, "started", (now_utc(), time.monotonic()))
        tel = telemetry()
        with observe.call_span(tel, self.spec) as span:
            outcome = self._loop()
            observe.call_ended(tel, span, self.spec, outcome)
        if self.parent_txn is not None:
            self.parent_txn.stage_record(self._record(outcome), self.at.candidate, self.seam.plan)
        elif not outcome.ok:  # a top-level success's record was committed with its context (_execute)
            self.env.records([StagedRecord(self._record(outcome), self.at.candidate, self.seam.plan)])
        return outcome

    def _record(self, outcome: Outcome) -> CallRecord:
        started, clock = self.started
        return self.recorder.record(outcome, started, time.monotonic() - clock)

    # --- the loop ----------------------------------------------------------------------------------

    def _loop(self) -> Outcome:
        while True:
            self.at.next()
            outcome = self._attempt(Transaction(self.env.state, parent=self.parent_txn))
            if outcome is not None:
                return outcome

    def _attempt(self, txn: Transaction) -> Outcome | None:
        """One attempt: None when a lane retries, else the call's outcome."""
        candidate = self._obtain(txn)
        if not isinstance(candidate, ProgramCandidate):
            return self._answer(candidate)
        self.at.candidate = candidate
        manifest = self._manifest(candidate, txn)  # declared names checked before anything is built
        if not isinstance(manifest, Manifest):
            return self._answer(manifest)
        approval = self._validate(candidate.code, txn, manifest)  # nothing runs before the policy approves it
        if not isinstance(approval, Approval):
            return self._answer(approval)
        ready = self._environment(manifest, approval, txn)
        if not isinstance(ready, tuple):
            return self._answer(ready)
        self.at.stage = "validated"
        return self._execute(approval, txn, ready[0])

    def _answer(self, step: Step) -> Outcome | None:
        return None if step is None else self.recorder.error(step)

    def _rollback(self, txn: Transaction) -> None:
        self.lanes.rolled_back(txn.rollback())
        self.at.stage = "rolled_back"

    # --- the steps ---------------------------------------------------------------------------------

    def _obtain(self, txn: Transaction) -> ProgramCandidate | Step:
        request = generation_request(self.spec, self.at.number, txn, self.lanes.feedback,
                                     self.env.policy.dependencies.allowed)  # fmt: skip
        try:
            return self.seam.obtain(request, self.at, self.lanes.failures, retrying=bool(self.lanes.feedback))
        except BudgetStop as exc:
            self._rollback(txn)
            return Failure.stopped(exc.stop)
        except InvalidProviderOutput as exc:
            self._rollback(txn)
            return self.lanes.generation_failure(self.at, exc.kind, "invalid_provider_output", exc.message)
        except ProviderError as exc:
            self._rollback(txn)
            return Failure(exc.error_type, exc.message, exc.retriable,
                           {"provider_error_kind": exc.kind, "failure_class": "extrinsic"})  # fmt: skip
        except Exception as exc:  # a provider bug must not escape as a tool failure
            log.exception("provider %s failed unexpectedly", self.env.provider_name)
            self._rollback(txn)
            return Failure("provider", f"the provider failed: {type(exc).__name__}", False,
                           {"provider_error_kind": "internal", "failure_class": "extrinsic"})  # fmt: skip

    def _manifest(self, candidate: ProgramCandidate, txn: Transaction) -> Manifest | Step:
        try:
            return manifest_for(candidate.code, candidate.dependencies, self.env.policy.dependencies)
        except EnvironmentFailure as exc:  # invalid manifest, or a declared name the policy refuses
            return self._refused(failure_result(exc, self.env.policy), candidate.code, txn)

    def _refused(self, result: ValidationResult, code: str, txn: Transaction) -> Step:
        """A recoverable refusal found outside the policy engine (the manifest, its environment)."""
        self.at.validation = result
        self._rollback(txn)
        return self.lanes.validation_failure(self.at, result, code)

    def _judge_imports(self, manifest: Manifest) -> Callable[[ValidationResult], ValidationResult]:
        def adjust(result: ValidationResult) -> ValidationResult:
            judged, self.at.pending_imports = judge_imports(
                result, self.env.policy.dependencies, declared=bool(manifest), provided=None
            )
            return judged

        return adjust

    def _environment(self, manifest: Manifest, approval: Approval, txn: Transaction) -> Ready | Step:
        """The program's environment, prepared (cache hit or build), as the sandbox takes it."""
        if not manifest:
            return (None,)
        envs = self.env.environments or default_environments()
        try:
            target = envs.target(self.env.sandbox, self.env.backend)
            stored = self.at.candidate.environment if self.at.candidate is not None else None
            prepared = envs.prepare_for(manifest, stored, self.env.policy.dependencies, target)
        except EnvironmentFailure as exc:
            self._rollback(txn)
            return self._environment_failure(exc, approval.code)
        except Exception as exc:  # a probe that could not run (the engine down): the world's fault
            log.exception("preparing the environment failed")
            self._rollback(txn)
            return Failure("dependency_install_failed", f"the environment could not be prepared: {exc}"[:500],
                           True, {"failure_class": "extrinsic"})  # fmt: skip
        self.executor.env_fields = prepared.log_fields()
        if self.at.candidate is not None:  # what a stored artifact keeps: the manifest and its environment
            update = {"environment": prepared.record.spec, "dependencies": manifest.lines()}
            self.at.candidate = self.at.candidate.model_copy(update=update)
        provided = declared_modules(prepared, manifest)
        missing = [module for module in self.at.pending_imports if module not in provided]
        if missing:
            violation = undeclared_violation(missing, self.env.policy.dependencies)
            result = approval.result.model_copy(update={"verdict": "recoverable", "violations": [violation]})
            return self._refused(result, approval.code, txn)
        try:
            return (mount_of(prepared, manifest),)
        except EnvironmentFailure as exc:
            self._rollback(txn)
            return self._environment_failure(exc, approval.code)

    def _environment_failure(self, exc: EnvironmentFailure, code: str) -> Step:
        """The lanes of ``runtime/environments/errors.py``: recoverable kinds are feedback to the model, a
        failed resolution is the manifest's fault (execution-repair lane), the rest the world's (retriable)."""
        if exc.kind in RECOVERABLE:
            result = failure_result(exc, self.env.policy)
            self.at.validation = result
            return self.lanes.validation_failure(self.at, result, code)
        if exc.kind == "dependency_resolution_failed":
            if self.lanes.retry(self.at, "execution", exc.kind, exc.kind, str(exc), code=code,
                                failure_class="intrinsic"):  # fmt: skip
                return None
            self.lanes.execution_exhausted = True
            return Failure(exc.kind, str(exc), False, {"failure_class": "intrinsic"})
        _terminal, retriable, _health = LIFECYCLE[exc.kind]
        return Failure(exc.kind, str(exc), retriable, {"failure_class": "extrinsic"})

    def _validate(self, code: str, txn: Transaction, manifest: Manifest) -> Approval | Step:
        problem = syntax_problem(code)
        if problem is not None:
            self._rollback(txn)
            return self.lanes.generation_failure(self.at, "invalid_code", "invalid_code", problem, code)
        try:
            with observe.stage(telemetry(), "validate") as span:
                result, approval = approve(code, self.env.policy, adjust=self._judge_imports(manifest))
                observe.validated(span, result)
        except Exception as exc:
            log.exception("guardrail validation failed")
            self._rollback(txn)
            return Failure("guardrail_violation", f"the guardrail engine failed: {type(exc).__name__}")
        self.at.validation = result
        if approval is not None:
            return approval
        self._rollback(txn)
        violations = list(result.violations)
        if violations and all(v.violation_type == "invalid_code" for v in violations):
            return self.lanes.generation_failure(self.at, "invalid_code", "invalid_code", violations[0].message, code)
        return self.lanes.validation_failure(self.at, result, code)

    def _execute(self, approval: Approval, txn: Transaction, environment: EnvironmentMount | None) -> Outcome | None:
        stop = self.meter.charge("sandbox", self.spec.call_deadline)
        if stop is not None:
            self._rollback(txn)
            return self._answer(Failure.stopped(stop))
        execution = self.executor.execute(approval, txn, environment)
        self.at.execution = execution
        self.lanes.executed(egress_of(execution))
        self.at.stage = "executed"
        if execution.ok and (violation := self._deliverable_violation(execution, txn)) is not None:
            self._rollback(txn)
            return self._answer(self.lanes.contract_violation(self.at, violation, approval.code))
        if execution.ok:
            assert execution.context_snapshot is not None
            outcome = self.recorder.ok(execution)
            with observe.stage(telemetry(), "commit"):
                txn.set_context(self.spec.role, execution.context_snapshot)  # unchanged keys keep their bytes
                if self.parent_txn is None:  # the record commits with the context (one transaction when durable)
                    txn.stage_record(self._record(outcome), self.at.candidate, self.seam.plan)
                txn.commit()
            return outcome
        self._rollback(txn)
        if self.executor.trace_stop is not None:
            return self._answer(Failure.stopped(self.executor.trace_stop))
        return self._answer(self.lanes.execution_failure(self.at, execution, approval.code,
                                                         nested_extrinsic=self.executor.nested_extrinsic))

    def _deliverable_violation(self, ex: ExecutionOutcome, txn: Transaction) -> ContractViolation | None:
        """Check the value of a successful execution against the role's declared deliverable (if any)."""
        contract = txn.contract(self.spec.role)
        if contract is None and self.seam.plan is not None:
            contract = self.seam.plan.contract
        if contract is None or contract.deliverable is None:
            return None
        try:
            return check_deliverable(ex.value, contract.deliverable)
        except Exception:  # a validator bug must not fail the call as if the tool were wrong
            log.exception("deliverable check of %s.%s failed", self.spec.role, self.spec.method)
            return None
