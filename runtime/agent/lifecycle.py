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
from dataclasses import dataclass, field

from sandforge.runtime.agent.attempt import Attempt
from sandforge.runtime.agent.calllog import now_utc
from sandforge.runtime.agent.contracts import ContractViolation, check_deliverable
from sandforge.runtime.agent.egress import egress_of
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.execution import Executor
from sandforge.runtime.agent.lanes import GUARDRAIL_EXHAUSTED_MESSAGE, NORMALIZATION_POLICY, Failure, Lanes
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.recording import Recorder
from sandforge.runtime.agent.requests import generation_request, syntax_problem
from sandforge.runtime.agent.seam import ProgramSeam
from sandforge.runtime.agent.source import ProgramCandidate
from sandforge.runtime.agent.state import StagedRecord, Transaction
from sandforge.runtime.agent.trace_budget import BudgetStop, TraceMeter
from sandforge.runtime.gate import Approval, approve
from sandforge.runtime.providers.base import InvalidProviderOutput, ProviderError
from sandforge.sandbox import ExecutionOutcome

__all__ = ["GUARDRAIL_EXHAUSTED_MESSAGE", "NORMALIZATION_POLICY", "CallEnv", "CallRun", "CallSpec"]

log = logging.getLogger(__name__)

#: A step's answer: go on with this value, end the call with a Failure, or None (a lane retries).
Step = Failure | None


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
        started, clock = now_utc(), time.monotonic()
        outcome = self._loop()
        record = self.recorder.record(outcome, started, time.monotonic() - clock)
        if self.parent_txn is not None:
            self.parent_txn.stage_record(record, self.at.candidate, self.seam.plan)
        else:
            self.env.records([StagedRecord(record, self.at.candidate, self.seam.plan)])
        return outcome

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
        approval = self._validate(candidate.code, txn)  # nothing runs before the policy approves it
        if not isinstance(approval, Approval):
            return self._answer(approval)
        self.at.stage = "validated"
        return self._execute(approval, txn)

    def _answer(self, step: Step) -> Outcome | None:
        return None if step is None else self.recorder.error(step)

    def _rollback(self, txn: Transaction) -> None:
        self.lanes.rolled_back(txn.rollback())
        self.at.stage = "rolled_back"

    # --- the steps ---------------------------------------------------------------------------------

    def _obtain(self, txn: Transaction) -> ProgramCandidate | Step:
        request = generation_request(self.spec, self.at.number, txn, self.lanes.feedback)
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

    def _validate(self, code: str, txn: Transaction) -> Approval | Step:
        problem = syntax_problem(code)
        if problem is not None:
            self._rollback(txn)
            return self.lanes.generation_failure(self.at, "invalid_code", "invalid_code", problem, code)
        try:
            result, approval = approve(code, self.env.policy)
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

    def _execute(self, approval: Approval, txn: Transaction) -> Outcome | None:
        stop = self.meter.charge("sandbox", self.spec.call_deadline)
        if stop is not None:
            self._rollback(txn)
            return self._answer(Failure.stopped(stop))
        execution = self.executor.execute(approval, txn)
        self.at.execution = execution
        self.lanes.executed(egress_of(execution))
        self.at.stage = "executed"
        if execution.ok and (violation := self._deliverable_violation(execution, txn)) is not None:
            self._rollback(txn)
            return self._answer(self.lanes.contract_violation(self.at, violation, approval.code))
        if execution.ok:
            assert execution.context_snapshot is not None
            txn.set_context(self.spec.role, execution.context_snapshot)  # unchanged keys keep their bytes
            txn.commit()
            return self.recorder.ok(execution)
        self._rollback(txn)
        if self.executor.trace_stop is not None:
            return self._answer(Failure.stopped(self.executor.trace_stop))
        return self._answer(self.lanes.execution_failure(self.at, execution, approval.code))

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
