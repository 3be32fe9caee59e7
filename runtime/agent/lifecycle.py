"""The lifecycle of one dynamic call (ADR 0016): obtain -> validate -> execute -> commit, with bounded lanes.

Each attempt runs in its own :class:`~runtime.agent.state.Transaction`; only a successful attempt commits.
A failed attempt is rolled back, recorded in ``attempt_failures`` and, when its lane has budget left,
followed by a regeneration that carries structured feedback:

============================  ===============================  ============================================
failure                       lane / budget                    when exhausted (or not eligible)
============================  ===============================  ============================================
no usable program, syntax     generation_retry_budget          ``generation_retry_exhausted``
recoverable guardrail         guardrail_recovery_budget        ``guardrail_retry_exhausted`` (normalized at
                                                               depth 0)
terminal guardrail            none                             ``guardrail_violation`` at once
program raised / misbehaved   execution_repair_budget          the last execution error, non-retriable
retriable ``Outcome.error``   fresh_outcome_repair_budget      ``outcome_repair_retry_exhausted``
(adaptive or intrinsic)
extrinsic failure             none                             returned unchanged
provider API error            none (the SDK retried)           ``provider``, retriable as classified
============================  ===============================  ============================================
"""

from __future__ import annotations

import ast
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue, ValidationError

from sandforge.runtime.agent.bounds import INVALID_TOOL_CALL, json_problem, nested_call_spec
from sandforge.runtime.agent.calllog import (
    MAX_STDOUT_CHARS,
    STORE_FIELDS,
    AttemptFailure,
    AttemptStage,
    CallRecord,
    Capability,
    FailureStage,
    NestedCallSummary,
    Usage,
    bounded,
    bounded_json,
    now_utc,
)
from sandforge.runtime.agent.contracts import ContractViolation, InvalidContract, check_contract, check_deliverable
from sandforge.runtime.agent.failures import EXECUTION_FAILURES, FailureClass, classify_failure, classify_outcome
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.source import ProgramCandidate, ProgramPlan, ProgramStore, PromptExtras
from sandforge.runtime.agent.state import ToolContract, Transaction
from sandforge.runtime.agent.trace_budget import BudgetStop, Stop, TraceMeter
from sandforge.runtime.guardrails import ValidationResult, validate
from sandforge.runtime.providers.base import (
    AttemptFeedback,
    FeedbackKind,
    GenerationRequest,
    InvalidProviderOutput,
    ProviderError,
    RepairContext,
)
from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.exchange import serving_deadline
from sandforge.sandbox.inside.world import ALLOWED_MODULES
from sandforge.sandbox.protocol import CallFrame, DeclareFrame

if TYPE_CHECKING:
    from sandforge.runtime.agent.workspace import Workspace

log = logging.getLogger(__name__)

#: What a top-level caller reads when guardrail recovery is exhausted (ADR 0016 section 7, ADR 0022).
GUARDRAIL_EXHAUSTED_MESSAGE = (
    "The tool could not produce a program that satisfies the runtime safety policy, so nothing was run. "
    "Details are in the call log."
)
#: Versioned name of the rule that replaced a depth-0 exhaustion message (recorded with the outcome).
NORMALIZATION_POLICY = "boundary-normalization/v1"
MAX_CONTEXT_KEYS_IN_PROMPT = 50
LANE_STAGE: dict[FeedbackKind, FailureStage] = {
    "generation": "generation",
    "guardrail": "validation",
    "execution": "execution",
    "outcome": "outcome_policy",
}
MAX_PREVIEW_CHARS = 200


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def _location(violation: Any) -> str | None:
    loc = getattr(violation, "location", None)
    if loc is None:
        return None
    line, column = getattr(loc, "line", None), getattr(loc, "column", None)
    source = (getattr(loc, "source_line", None) or "").strip()
    text = f"line {line}" if line is not None else "unknown line"
    if column is not None:
        text += f", column {column}"
    return f"{text}: {source}" if source else text


def _syntax_problem(code: str) -> str | None:
    if not code.strip():
        return "the program is empty"
    try:
        ast.parse(code, "<tool>", "exec")
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"the program cannot be parsed: {type(exc).__name__}"
    return None


def _preview(value: Any) -> str:
    text = repr(value)
    if len(text) > MAX_PREVIEW_CHARS:
        text = text[: MAX_PREVIEW_CHARS - 3] + "..."
    return f"{type(value).__name__} = {text}"


@dataclass
class _Lanes:
    generation: int = 0
    guardrail: int = 0
    execution: int = 0
    outcome: int = 0
    generation_exhausted: bool = False
    guardrail_exhausted: bool = False
    execution_exhausted: bool = False
    outcome_exhausted: bool = False


@dataclass
class CallRun:
    """One logical call: every attempt, its lanes and its record. ``run`` never raises for tool failures."""

    ws: Workspace
    parent_txn: Transaction | None
    role: str
    method: str
    args: list[JsonValue]
    kwargs: dict[str, JsonValue]
    depth: int = 0
    trace_id: str = field(default_factory=new_id)
    parent_call_id: str | None = None
    call_id: str = field(default_factory=new_id)

    attempt: int = 0
    stage: AttemptStage = "generated"
    lanes: _Lanes = field(default_factory=_Lanes)
    failures: list[AttemptFailure] = field(default_factory=list)
    feedback: list[AttemptFeedback] = field(default_factory=list)
    provider_calls: int = 0
    rollback_applied: bool = False
    validation_failure_type: str | None = None
    candidate: ProgramCandidate | None = None
    validation: ValidationResult | None = None
    execution: ExecutionOutcome | None = None
    sandbox_seconds: float = 0.0
    nested_calls: int = 0
    discarded: list[NestedCallSummary] = field(default_factory=list)
    plan: ProgramPlan | None = None
    extras: PromptExtras | None = None
    extras_asked: bool = False
    repair_attempted: bool = False
    #: the trace's account, shared with every nested call (created by the top-level call)
    meter: TraceMeter | None = None
    #: when the execution that made this nested call runs out of time (None at the top level)
    call_deadline: float | None = None
    #: when the current attempt's execution runs out of time: its nested calls' ``call_deadline``
    exec_deadline: float | None = None
    bridge_seconds: float = 0.0
    #: set when the trace's wall-clock budget (not the program's own limit) ended the last execution
    trace_stop: Stop | None = None

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> Outcome:
        started, clock = now_utc(), time.monotonic()
        if self.meter is None:
            self.meter = TraceMeter(self.ws.trace_budget)
        outcome = self._loop()
        record = self._record(outcome, started, time.monotonic() - clock)
        if self.parent_txn is not None:
            self.parent_txn.stage_record(record, self.candidate, self.plan)
        else:
            self.ws._emit_record(record, self.candidate, self.plan)
        return outcome

    def _loop(self) -> Outcome:
        while True:
            self.attempt += 1
            self.stage = "generated"
            self.candidate, self.validation, self.execution = None, None, None
            txn = Transaction(self.ws._state, parent=self.parent_txn)
            request = self._generation_request(txn)
            try:
                self.candidate = self._obtain_program(request)
            except BudgetStop as exc:
                self._rollback(txn)
                return self._stopped(exc.stop)
            except InvalidProviderOutput as exc:
                self._rollback(txn)
                if self._retry("generation", exc.kind, "invalid_provider_output", exc.message):
                    continue
                return self._exhausted_generation()
            except ProviderError as exc:
                self._rollback(txn)
                return self._error(exc.error_type, exc.message, retriable=exc.retriable,
                                   provider_error_kind=exc.kind, failure_class="extrinsic")  # fmt: skip
            except Exception as exc:  # a provider bug must not escape as a tool failure
                log.exception("provider %s failed unexpectedly", self.ws.provider_name)
                self._rollback(txn)
                return self._error("provider", f"the provider failed: {type(exc).__name__}", retriable=False,
                                   provider_error_kind="internal", failure_class="extrinsic")  # fmt: skip

            code = self.candidate.code
            problem = _syntax_problem(code)
            if problem is not None:
                self._rollback(txn)
                if self._retry("generation", "invalid_code", "invalid_code", problem, code=code):
                    continue
                return self._exhausted_generation()

            # --- validation (nothing runs before it) ---
            try:
                result = validate(code, self.ws.policy)
            except Exception as exc:
                log.exception("guardrail validation failed")
                self._rollback(txn)
                return self._error("guardrail_violation", f"the guardrail engine failed: {type(exc).__name__}")
            self.validation = result
            if result.verdict != "approved":
                self._rollback(txn)
                violations = list(result.violations)
                if violations and all(v.violation_type == "invalid_code" for v in violations):
                    if self._retry("generation", "invalid_code", "invalid_code", violations[0].message, code=code):
                        continue
                    return self._exhausted_generation()
                outcome = self._validation_failure(result, code)
                if outcome is None:
                    continue
                return outcome
            self.stage = "validated"

            # --- execution ---
            stop = self._meter.charge("sandbox", self.call_deadline)
            if stop is not None:
                self._rollback(txn)
                return self._stopped(stop)
            execution = self._execute(code, txn)
            self.execution = execution
            self.stage = "executed"
            if execution.ok and (violation := self._deliverable_violation(execution, txn)) is not None:
                self._rollback(txn)
                outcome = self._contract_violation(violation, code)
                if outcome is None:
                    continue
                return outcome
            if execution.ok:
                assert execution.context_snapshot is not None
                txn.set_context(self.role, execution.context_snapshot)  # unchanged keys keep their bytes
                txn.commit()
                return self._ok(execution)
            self._rollback(txn)
            if self.trace_stop is not None:
                return self._stopped(self.trace_stop)
            outcome = self._execution_failure(execution, code)
            if outcome is None:
                continue
            return outcome

    # --- the seam ----------------------------------------------------------------------------------

    def _obtain_program(self, request: GenerationRequest) -> ProgramCandidate:
        """The single place a program comes from: the store's plan (first attempt), else the provider.

        First attempt: a persisted candidate runs as is; a repair plan asks the provider to repair the
        prior code (``repaired``); otherwise generate. The attempt right after a failed persisted one
        repairs it when the plan allows (``repair_on_failure``); any later attempt regenerates."""
        store = self.ws.store
        if store is not None and self.attempt == 1 and not self.feedback:
            self.plan = self._lookup(store, request)
            if self.plan is not None and self.plan.candidate is not None:
                return self.plan.candidate
            if self.plan is not None and self.plan.repair is not None:
                return self._generate(request, self.plan.repair)
        elif (repair := self._repair_after_persisted_failure()) is not None:
            return self._generate(request, repair)
        return self._generate(request, None)

    def _lookup(self, store: ProgramStore, request: GenerationRequest) -> ProgramPlan | None:
        try:
            found = store.lookup(request)
        except Exception:
            log.exception("program store lookup failed; generating instead")
            return None
        if found is None or isinstance(found, ProgramPlan):
            return found
        if isinstance(found, ProgramCandidate):
            return ProgramPlan(candidate=found)
        log.warning("program store lookup returned %s; generating instead", type(found).__name__)
        return None

    def _repair_after_persisted_failure(self) -> RepairContext | None:
        plan = self.plan
        if plan is None or plan.candidate is None or plan.repair_on_failure is None or self.attempt != 2:
            return None
        if not self.failures or self.failures[-1].program_source != "persisted":
            return None
        last = self.failures[-1]
        return plan.repair_on_failure.model_copy(
            update={"error_type": last.error_type or last.error_class, "error_message": last.error_message,
                    "failure_class": last.failure_class}
        )  # fmt: skip

    def _prompt_extras(self, request: GenerationRequest) -> PromptExtras | None:
        """The store's prompt blocks for this call, asked once (before its first provider request)."""
        if not self.extras_asked:
            self.extras_asked = True
            if self.plan is not None and self.plan.prompt_extras is not None:
                try:
                    self.extras = self.plan.prompt_extras(request)
                except Exception:
                    log.exception("program store prompt extras failed; generating without them")
        return self.extras

    def _generate(self, request: GenerationRequest, repair: RepairContext | None) -> ProgramCandidate:
        update: dict[str, Any] = {}
        extras = self._prompt_extras(request)
        if extras is not None:
            update["known_tools_block"] = extras.known_tools_block
            update["recent_patterns"] = extras.recent_patterns if self.depth == 0 else None
        if request.contract is None and self.plan is not None and self.plan.contract is not None:
            update["contract"] = self.plan.contract
        if repair is not None:
            update["repair"] = repair
            self.repair_attempted = True
        if update:
            request = request.model_copy(update=update)
        stop = self._meter.charge("provider_call", self.call_deadline)
        if stop is not None:
            raise BudgetStop(stop)
        request = request.model_copy(update={"time_budget_s": self._meter.time_left(self.call_deadline)})
        self.provider_calls += 1
        candidate = ProgramCandidate.from_generated(self.ws.provider.generate(request))
        if repair is not None:
            candidate = candidate.model_copy(update={"source": "repaired"})
        return candidate

    # --- lanes -------------------------------------------------------------------------------------

    def _rollback(self, txn: Transaction) -> None:
        self.discarded = txn.rollback()
        self.rollback_applied = True
        self.stage = "rolled_back"

    def _budget(self, lane: FeedbackKind) -> tuple[int, int]:
        b = self.ws.budgets
        return {
            "generation": (self.lanes.generation, b.generation_retry_budget),
            "guardrail": (self.lanes.guardrail, b.guardrail_recovery_budget),
            "execution": (self.lanes.execution, b.execution_repair_budget),
            "outcome": (self.lanes.outcome, b.fresh_outcome_repair_budget),
        }[lane]

    def _retry(
        self,
        lane: FeedbackKind,
        error_class: str,
        error_type: str | None,
        message: str,
        *,
        code: str | None = None,
        failure_class: str | None = None,
        violation: Any = None,
    ) -> bool:
        """Record the failed attempt; spend one unit of ``lane`` and queue feedback if any is left."""
        stage = LANE_STAGE[lane]
        location = _location(violation) if violation is not None else None
        self.failures.append(
            AttemptFailure(
                attempt_id=self._attempt_id(),
                attempt_number=self.attempt,
                call_id=self.call_id,
                stage=stage,
                error_class=error_class[:200],
                error_type=error_type,
                error_message=bounded(message) or "",
                failure_class=failure_class,
                violation_location=bounded(location),
                program_source=self.candidate.source if self.candidate else None,
                timestamp=now_utc(),
                discarded_nested_calls=self.discarded,
            )
        )
        self.discarded = []
        used, budget = self._budget(lane)
        if used >= budget:
            return False
        used += 1
        setattr(self.lanes, lane, used)
        feedback = AttemptFeedback(
            kind=lane,
            attempt_number=self.attempt,
            remaining_budget=budget - used,
            error_type=error_type if lane != "guardrail" else None,
            error_message=bounded(message, 2000) if lane != "guardrail" else None,
            failure_class=failure_class,
            violation_type=getattr(violation, "violation_type", None),
            violation_message=bounded(getattr(violation, "message", None), 2000),
            violation_location=location,
            required_correction=getattr(violation, "required_correction", None),
            previous_code=code,
        )
        self.feedback.append(feedback)
        return True

    def _validation_failure(self, result: ValidationResult, code: str) -> Outcome | None:
        violations = list(result.violations)
        terminal = [v for v in violations if str(v.classification).startswith("terminal")]
        first = terminal[0] if terminal else violations[0]
        self.validation_failure_type = first.violation_type
        message = f"{first.violation_type}: {first.message}"
        if result.verdict == "terminal" or terminal:
            self._retry_record_only("validation", first, first.message)
            return self._error(
                "guardrail_violation", message, retriable=False, violations=_violations(result),
                policy_fingerprint=result.policy_fingerprint,
            )  # fmt: skip
        if self._retry("guardrail", first.violation_type, "guardrail_violation", first.message, code=code,
                       failure_class="recoverable", violation=first):  # fmt: skip
            return None
        self.lanes.guardrail_exhausted = True
        last = {
            "violation_type": first.violation_type,
            "violation_message": first.message,
            "violation_location": _location(first),
            "required_correction": first.required_correction,
            "violations": _violations(result),
        }
        raw = f"guardrail_retry_exhausted after {self.attempt} attempts; last violation {message}" + (
            f" ({_location(first)})" if _location(first) else ""
        )
        user_message = GUARDRAIL_EXHAUSTED_MESSAGE if self.depth == 0 else raw
        normalized = {"normalization_policy": NORMALIZATION_POLICY} if self.depth == 0 else {}
        return self._error(
            "guardrail_retry_exhausted", user_message, retriable=False, last_violation=last,
            raw_error_message=raw, normalized=self.depth == 0, **normalized,
        )  # fmt: skip

    def _retry_record_only(self, stage: FailureStage, violation: Any, message: str) -> None:
        self.failures.append(
            AttemptFailure(
                attempt_id=self._attempt_id(), attempt_number=self.attempt, call_id=self.call_id, stage=stage,
                error_class=str(violation.violation_type)[:200], error_type="guardrail_violation",
                error_message=bounded(message) or "", failure_class="terminal",
                violation_location=bounded(_location(violation)),
                program_source=self.candidate.source if self.candidate else None, timestamp=now_utc(),
            )
        )  # fmt: skip

    def _execution_failure(self, ex: ExecutionOutcome, code: str) -> Outcome | None:
        error_type = ex.error_type.value if ex.error_type else "execution"
        message = ex.error_message or error_type
        if ex.error_type is ErrorType.TOOL_ERROR:
            tool_type = str(ex.metadata.get("tool_error_type") or "tool_error")
            cls = classify_outcome(tool_type, tool_error=True, retriable=ex.retriable)  # never extrinsic
            if not ex.retriable or cls is FailureClass.EXTRINSIC:
                return self._error(tool_type, message, retriable=ex.retriable, failure_class=cls.value, tool_error=True)
            if self._retry("outcome", tool_type, tool_type, message, code=code, failure_class=cls.value):
                return None
            self.lanes.outcome_exhausted = True
            return self._error(
                "outcome_repair_retry_exhausted",
                f"the tool kept returning a retriable error ({tool_type}: {message})",
                retriable=False,
                failure_class=cls.value,
                last_outcome={
                    "error_type": tool_type,
                    "error_message": bounded(message),
                    "failure_class": cls.value,
                    "retriable": ex.retriable,
                },
            )
        if ex.error_type in EXECUTION_FAILURES:
            exception = ex.metadata.get("exception") or error_type
            line = ex.metadata.get("line")
            detail = f"{message} (line {line})" if line else message
            if self._retry("execution", str(exception), error_type, detail, code=code,
                           failure_class=FailureClass.INTRINSIC.value):  # fmt: skip
                return None
            self.lanes.execution_exhausted = True
            return self._error(error_type, message, retriable=False, failure_class=FailureClass.INTRINSIC.value)
        # extrinsic (timeout, sandbox unavailable) or the host's own fault: unchanged, never regenerated
        cls = classify_failure(error_type)
        return self._error(error_type, message, retriable=ex.retriable, failure_class=cls.value)

    def _deliverable_violation(self, ex: ExecutionOutcome, txn: Transaction) -> ContractViolation | None:
        """Check the value of a successful execution against the role's declared deliverable (if any)."""
        contract = txn.contract(self.role)
        if contract is None and self.plan is not None:
            contract = self.plan.contract
        if contract is None or contract.deliverable is None:
            return None
        try:
            return check_deliverable(ex.value, contract.deliverable)
        except Exception:  # a validator bug must not fail the call as if the tool were wrong
            log.exception("deliverable check of %s.%s failed", self.role, self.method)
            return None

    def _contract_violation(self, violation: ContractViolation, code: str) -> Outcome | None:
        """A result that does not match the deliverable: adaptive, outcome-repair lane, never committed."""
        adaptive = FailureClass.ADAPTIVE.value
        if self._retry("outcome", "contract_violation", "contract_violation", violation.text, code=code,
                       failure_class=adaptive):  # fmt: skip
            return None
        self.lanes.outcome_exhausted = True
        return self._error(
            "contract_violation", violation.text, retriable=True, failure_class=adaptive,
            contract_violation=violation.model_dump(),
        )  # fmt: skip

    def _stopped(self, stop: Stop) -> Outcome:
        """The trace budget or the caller's deadline ended the call: host-observed, so extrinsic."""
        return self._error(stop.error_type, stop.message, retriable=False, **stop.metadata())

    def _exhausted_generation(self) -> Outcome:
        self.lanes.generation_exhausted = True
        last = self.failures[-1]
        return self._error(
            "generation_retry_exhausted",
            f"the provider did not produce a usable program in {self.attempt} attempts ({last.error_message})",
            retriable=False,
        )

    # --- execution and nested calls ----------------------------------------------------------------

    @property
    def _meter(self) -> TraceMeter:
        assert self.meter is not None, "run() creates the trace meter"
        return self.meter

    def _execute(self, code: str, txn: Transaction) -> ExecutionOutcome:
        limits = self.ws.limits
        seconds, self.exec_deadline, by_trace = self._meter.execution_window(limits.timeout_s, self.call_deadline)
        request = ExecutionRequest(
            code=code, context=txn.snapshot(self.role), args=self.args, kwargs=self.kwargs, limits=limits,
            wall_budget_s=max(seconds, 0.001) if seconds < limits.timeout_s else None,
        )  # fmt: skip

        bridge = _Bridge(self, txn)

        try:
            outcome = self.ws.sandbox.execute(request, backend=self.ws.backend, bridge=bridge)
        except Exception as exc:  # Sandbox.execute promises not to raise; a backend import error still can
            log.exception("sandbox failed")
            outcome = ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, f"the sandbox could not run: {type(exc).__name__}: {exc}",
                retriable=False, backend=self.ws.backend or "",
            )  # fmt: skip
        self.sandbox_seconds += outcome.duration_s
        waited = outcome.metadata.get("bridge_s")
        self.bridge_seconds += waited if isinstance(waited, (int, float)) else 0.0
        if by_trace and outcome.error_type is ErrorType.TIMEOUT:
            self.trace_stop = self._meter.wall_exhausted()
        return outcome

    def _declare(self, frame: DeclareFrame, txn: Transaction) -> dict[str, Any]:
        """``delegate(...)`` ran: stage its contract with this attempt (committed only if the attempt is)."""
        target = frame.target
        checked = nested_call_spec(target, "declare")  # the same bounds on names and fields as a call's
        if isinstance(checked, str):
            return _wire_error("invalid_contract", checked)
        try:
            contract = ToolContract(role=target.name, purpose=target.purpose, deliverable=target.deliverable,
                                    acceptance=target.acceptance, failure_policy=target.failure_policy)  # fmt: skip
            check_contract(contract)
        except (InvalidContract, ValidationError) as exc:
            return {"status": "error", "error_type": "invalid_contract", "retriable": False,
                    "error_message": bounded(str(exc), 2000)}  # fmt: skip
        except Exception as exc:
            log.exception("declaring %s failed in the host", target.name)
            return {"status": "error", "error_type": "internal_error", "retriable": False,
                    "error_message": f"the host failed to stage the contract: {type(exc).__name__}"}  # fmt: skip
        txn.register(contract)
        return {"status": "ok"}

    @staticmethod
    def _withdraw(txn: Transaction, role: str) -> None:
        """A delegated call that failed registers nothing: drop the contract this attempt staged for it."""
        txn.tools.pop(role, None)

    def _nested(self, frame: CallFrame, txn: Transaction) -> dict[str, Any]:
        """Answer one ``tool(...)``/``delegate(...)`` method call made by the running program.

        It draws on the trace budget and gets at most the time this execution has left. A delegate's
        contract is registered only if the nested call succeeds (a failed one leaves no tool behind)."""
        self.nested_calls += 1
        target = frame.target
        try:
            if self.depth + 1 > self.ws.budgets.max_depth:
                return {"status": "error", "error_type": "max_depth_exceeded", "retriable": False,
                        "error_message": f"nested calls are limited to depth {self.ws.budgets.max_depth}"}  # fmt: skip
            spec = nested_call_spec(target, frame.method)
            if isinstance(spec, str):
                return _wire_error(INVALID_TOOL_CALL, spec)
            problem = json_problem(list(frame.args), "the nested call's arguments") or json_problem(
                dict(frame.kwargs), "the nested call's keyword arguments"
            )
            if problem is not None:
                return _wire_error(INVALID_TOOL_CALL, problem)
            deadline = serving_deadline() or self.exec_deadline  # the deadline the exchange enforces
            stop = self._meter.charge("nested_call", deadline)
            if stop is not None:
                return _wire_error(stop.error_type, stop.message)
            scope = Transaction(self.ws._state, parent=txn)  # holds the contract until the call succeeds
            if spec.kind == "delegate":
                scope.register(
                    ToolContract(role=spec.role, purpose=spec.purpose, deliverable=spec.deliverable,
                                 acceptance=spec.acceptance, failure_policy=spec.failure_policy)
                )  # fmt: skip
            child = CallRun(
                ws=self.ws, parent_txn=scope, role=spec.role, method=spec.method, args=list(frame.args),
                kwargs=dict(frame.kwargs), depth=self.depth + 1, trace_id=self.trace_id, parent_call_id=self.call_id,
                meter=self.meter, call_deadline=deadline,
            )  # fmt: skip
            outcome = child.run()
            if not outcome.ok:
                scope.tools.clear()  # its record stays (the caller may still succeed); its contract does not
                if spec.kind == "delegate":
                    self._withdraw(txn, spec.role)  # nor the one its ``declare`` frame staged in this attempt
            scope.commit()
            return outcome.to_wire()
        except Exception as exc:
            log.exception("nested call %s.%s failed in the host", target.name, frame.method)
            return {"status": "error", "error_type": "internal_error", "retriable": False,
                    "error_message": f"the host failed to run the nested call: {type(exc).__name__}"}  # fmt: skip

    # --- results -----------------------------------------------------------------------------------

    def _attempt_id(self) -> str:
        return f"{self.call_id}.{self.attempt}"

    def _context_summary(self, txn: Transaction, snapshot: ContextSnapshot, keys: list[str]) -> dict[str, str]:
        """Previews of ``keys`` for the prompt, each decoded once per distinct text rather than on every call
        (a stored program runs without a model call, but its request is built all the same)."""
        cache = txn.state.previews
        known = cache.get(self.role, {})
        fresh: dict[str, tuple[bytes, str]] = {}
        for key in keys:
            text = snapshot[key]
            hit = known.get(key)
            fresh[key] = hit if hit is not None and hit[0] is text else (text, _preview(snapshot.value(key)))
        cache[self.role] = fresh
        return {key: preview for key, (_, preview) in fresh.items()}

    def _generation_request(self, txn: Transaction) -> GenerationRequest:
        snapshot = txn.snapshot(self.role)
        keys = sorted(snapshot)
        return GenerationRequest(
            role=self.role,
            method=self.method,
            args=self.args,
            kwargs=self.kwargs,
            depth=self.depth,
            attempt_number=self.attempt,
            context_keys=keys,
            context_summary=self._context_summary(txn, snapshot, keys[:MAX_CONTEXT_KEYS_IN_PROMPT]),
            contract=txn.contract(self.role),
            known_tools=sorted(txn.all_tools().values(), key=lambda t: t.role),
            allowed_modules=sorted(ALLOWED_MODULES),
            feedback=list(self.feedback),
        )

    def _common_metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "call_id": self.call_id,
            "trace_id": self.trace_id,
            "depth": self.depth,
            "attempts": self.attempt,
            "provider_calls": self.provider_calls,
            "program_source": self.candidate.source if self.candidate else None,
            "rollback_applied": self.rollback_applied,
            "retry_feedback_injected": bool(self.feedback),
            "guardrail_recovery_attempts": self.lanes.guardrail,
            "execution_repair_attempts": self.lanes.execution,
            "outcome_repair_attempts": self.lanes.outcome,
            "generation_retry_attempts": self.lanes.generation,
        }
        if self.failures:
            last = self.failures[-1]
            meta["attempt_failures"] = [f.model_dump(mode="json") for f in self.failures]
            meta["latest_failure_stage"] = last.stage
            meta["latest_failure_class"] = last.error_class
            meta["latest_failure_message"] = last.error_message
        if self.execution is not None:
            meta["backend"] = self.execution.backend
            if self.execution.stdout:
                meta["stdout"] = bounded(self.execution.stdout, MAX_STDOUT_CHARS)
        if self.validation is not None:
            meta["capabilities"] = sorted({c.tag for c in self.validation.capabilities})
            meta["policy_fingerprint"] = self.validation.policy_fingerprint
        return meta

    def _ok(self, ex: ExecutionOutcome) -> Outcome:
        return Outcome(status="ok", value=ex.value, tool_role=self.role, method_name=self.method,
                       metadata=self._common_metadata())  # fmt: skip

    def _error(self, error_type: str, message: str, *, retriable: bool = False, **extra: Any) -> Outcome:
        meta = self._common_metadata()
        meta.update(extra)
        if meta.get("failure_class") is None:  # every failure has one class: outcome, call log and store agree
            meta["failure_class"] = classify_outcome(
                error_type, tool_error=bool(meta.get("tool_error")), retriable=retriable
            ).value
        return Outcome(
            status="error", error_type=error_type, error_message=message, retriable=retriable,
            tool_role=self.role, method_name=self.method, metadata=meta,
        )  # fmt: skip

    def _store_fields(self, outcome: Outcome) -> dict[str, Any]:
        proposed: dict[str, Any] = {}
        if self.plan is not None:
            proposed.update(self.plan.log_fields)
        if self.extras is not None:
            proposed.update(self.extras.log_fields)
        unknown = set(proposed) - STORE_FIELDS
        if unknown:
            log.warning("program store proposed unknown call-log fields %s; ignored", sorted(unknown))
        fields = {k: v for k, v in proposed.items() if k in STORE_FIELDS}
        fields["repair_attempted"] = self.repair_attempted
        fields["repair_succeeded"] = (
            outcome.status == "ok" and self.candidate is not None and self.candidate.source == "repaired"
        )
        return fields

    def _record(self, outcome: Outcome, started: Any, duration: float) -> CallRecord:
        last = self.failures[-1] if self.failures else None
        ex, vr, cand = self.execution, self.validation, self.candidate
        totals = {"total_sandbox_duration_s": round(self.sandbox_seconds, 6),
                  "bridge_duration_s": round(self.bridge_seconds, 6)}  # fmt: skip
        usage = Usage(**totals)
        if ex is not None:
            usage = Usage(
                cpu_time_s=ex.usage.cpu_time_s, peak_memory_mb=ex.usage.peak_memory_mb, source=ex.usage.source,
                sandbox_duration_s=ex.duration_s, **totals,
            )  # fmt: skip
        fields: dict[str, Any] = dict(
            trace_id=self.trace_id,
            call_id=self.call_id,
            parent_call_id=self.parent_call_id,
            depth=self.depth,
            role=self.role,
            method=self.method,
            args=bounded_json(self.args),
            kwargs=bounded_json(self.kwargs),
            started_at=started,
            duration_s=round(duration, 6),
            program_source=cand.source if cand else None,
            **CallRecord.code_fields(cand.code if cand else None),
            dependencies=list(cand.dependencies) if cand else [],
            provider=(cand.provider if cand else None) or self.ws.provider_name,
            model=cand.model if cand else None,
            provider_calls=self.provider_calls,
            status=outcome.status,
            value=bounded_json(outcome.value),
            error_type=outcome.error_type,
            error_message=bounded(outcome.error_message),
            retriable=outcome.retriable,
            failure_class=outcome.metadata.get("failure_class"),
            normalization_policy=outcome.metadata.get("normalization_policy"),
            tool_error=bool(outcome.metadata.get("tool_error")),
            attempt_id=self._attempt_id(),
            attempts=self.attempt,
            attempt_stage=self.stage,
            validation_failure_type=self.validation_failure_type,
            rollback_applied=self.rollback_applied,
            retry_feedback_injected=bool(self.feedback),
            generation_retry_attempts=self.lanes.generation,
            generation_retry_exhausted=self.lanes.generation_exhausted,
            guardrail_recovery_attempts=self.lanes.guardrail,
            guardrail_retry_exhausted=self.lanes.guardrail_exhausted,
            execution_repair_attempts=self.lanes.execution,
            execution_repair_exhausted=self.lanes.execution_exhausted,
            outcome_repair_attempts=self.lanes.outcome,
            outcome_repair_triggered=self.lanes.outcome > 0,
            outcome_repair_retry_exhausted=self.lanes.outcome_exhausted,
            latest_failure_stage=last.stage if last else None,
            latest_failure_class=last.error_class if last else None,
            latest_failure_message=last.error_message if last else None,
            attempt_failures=list(self.failures),
            verdict=vr.verdict if vr else None,
            capabilities=[_capability(c) for c in vr.capabilities] if vr else [],
            policy_fingerprint=vr.policy_fingerprint if vr else None,
            backend=(ex.backend or None) if ex else None,
            usage=usage,
            nested_calls=self.nested_calls,
            stdout=bounded(ex.stdout, MAX_STDOUT_CHARS) if ex and ex.stdout else None,
            trace_usage=self.meter.usage() if self.meter is not None else None,
        )
        try:
            return CallRecord(**fields, **self._store_fields(outcome))
        except ValidationError:
            log.exception("program store proposed invalid call-log fields; logging the call without them")
            return CallRecord(**fields)


@dataclass
class _Bridge:
    """Answers the running program's nested calls and ``delegate(...)`` declarations for one attempt."""

    run: CallRun
    txn: Transaction

    def __call__(self, frame: CallFrame) -> dict[str, Any]:
        return self.run._nested(frame, self.txn)

    def declare(self, frame: DeclareFrame) -> dict[str, Any]:
        return self.run._declare(frame, self.txn)


def _wire_error(error_type: str, message: str) -> dict[str, Any]:
    return {"status": "error", "error_type": error_type, "error_message": message, "retriable": False}


def _violations(result: ValidationResult) -> list[dict[str, Any]]:
    return [v.model_dump(mode="json") for v in result.violations]


def _capability(capability: Any) -> Capability:
    evidence = [bounded(f"{e.line}:{e.column} {e.construct}", 200) or "" for e in list(capability.evidence or [])[:5]]
    return Capability(tag=capability.tag, granted=getattr(capability, "granted", None), evidence=evidence)
