"""Running an approved program, and answering what it asks the host while it runs.

:meth:`Executor.execute` runs one attempt's program through ``runtime.gate`` (it needs the gate's
:class:`~runtime.gate.Approval`); the attempt's :class:`AttemptBridge` answers the program's nested calls
(``tool(...)``/``delegate(...)`` methods, each a whole call of its own, run by ``run_nested``) and its
``delegate(...)`` declarations, staging both in the attempt's transaction, and its fetches, through one
:class:`~runtime.agent.egress.ExecutionEgress` per execution (the policy's broker, the execution's deadline).
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from sandforge.runtime.agent import observe
from sandforge.runtime.agent.bounds import INVALID_TOOL_CALL, NestedCallSpec, json_problem, nested_call_spec
from sandforge.runtime.agent.calllog import bounded
from sandforge.runtime.agent.contracts import InvalidContract, check_contract, check_inputs
from sandforge.runtime.agent.egress import HTTP_FETCH, NO_GRANT, ExecutionEgress, broker_for
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.state import ToolContract, Transaction
from sandforge.runtime.agent.trace_budget import Stop, TraceMeter
from sandforge.runtime.gate import Approval, execute_approved
from sandforge.runtime.telemetry import current as telemetry
from sandforge.sandbox import BridgeReply, ErrorType, ExecutionOutcome, ExecutionRequest, Limits
from sandforge.sandbox.channel import PipedBody
from sandforge.sandbox.exchange import serving_deadline
from sandforge.sandbox.protocol import CallFrame, DeclareFrame, EnvironmentMount

if TYPE_CHECKING:
    from sandforge.runtime.egress.broker import EgressBroker

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Runs a nested call to completion inside ``scope`` (the lifecycle's own loop, for a child call).
NestedRunner = Callable[[CallSpec, Transaction], Outcome]


def wire_error(error_type: str, message: str) -> BridgeReply:
    """A refusal of a nested frame, as the program inside sees it (never retriable)."""
    return BridgeReply.error(error_type, message)


_STAGED = BridgeReply(status="ok")


@dataclass
class Executor:
    """One call's executions: the sandbox time they took and what their programs asked of the host."""

    env: CallEnv
    spec: CallSpec
    meter: TraceMeter
    run_nested: NestedRunner
    sandbox_seconds: float = 0.0
    bridge_seconds: float = 0.0
    fetch_seconds: float = 0.0
    nested_calls: int = 0
    #: when the current attempt's execution runs out of time: its nested calls' ``call_deadline``
    exec_deadline: float | None = None
    #: set when the trace's wall-clock budget (not the program's own limit) ended the last execution
    trace_stop: Stop | None = None
    #: the current execution's fetches (its own, and what its nested calls fetched)
    fetches: ExecutionEgress | None = None
    #: error types of the current execution's nested calls that failed EXTRINSICALLY, as the host saw them
    #: (the child's own class, or the trace budget refusing the call): a program returning one is not
    #: making a claim (ADR 0012: extrinsic only when the host saw the cause in that execution)
    nested_extrinsic: set[str] = field(default_factory=set)
    #: the call log's environment fields of the last attempt that prepared one (issue 19)
    env_fields: dict[str, Any] = field(default_factory=dict)

    def execute(
        self, approval: Approval, txn: Transaction, environment: EnvironmentMount | None = None
    ) -> ExecutionOutcome:
        """Run the approved program once with the attempt's view of the context (and its environment,
        mounted read-only). Never raises."""
        limits, spec = self.env.limits, self.spec
        seconds, self.exec_deadline, by_trace = self.meter.execution_window(limits.timeout_s, spec.call_deadline)
        request = ExecutionRequest(
            code=approval.code, context=txn.snapshot(spec.role), args=spec.args, kwargs=spec.kwargs, limits=limits,
            wall_budget_s=max(seconds, 0.001) if seconds < limits.timeout_s else None, environment=environment,
            files=spec.files,  # every attempt starts from the same inputs
        )  # fmt: skip
        # the exchange hands each fetch the execution's deadline (the trace's budget and a parent's included)
        self.fetches = ExecutionEgress(self.egress_broker())
        self.nested_extrinsic = set()
        bridge = AttemptBridge(self, txn, self.fetches)
        tel = telemetry()
        with observe.stage(tel, "execute", {"sandforge.backend": self.env.backend}) as span:
            started_ns = time.time_ns()
            outcome = self._run(request, approval, bridge)
            observe.executed(tel, span, outcome, started_ns=started_ns)
        self.sandbox_seconds += outcome.duration_s
        waited = outcome.metadata.get("bridge_s")
        self.bridge_seconds += waited if isinstance(waited, (int, float)) else 0.0
        fetching = outcome.metadata.get("fetch_s")
        self.fetch_seconds += fetching if isinstance(fetching, (int, float)) else 0.0
        if by_trace and outcome.error_type is ErrorType.TIMEOUT:
            self.trace_stop = self.meter.wall_exhausted()
        return outcome

    def _run(self, request: ExecutionRequest, approval: Approval, bridge: AttemptBridge) -> ExecutionOutcome:
        try:
            outcome = execute_approved(self.env.sandbox, request, approval, backend=self.env.backend, bridge=bridge)
        except Exception as exc:  # Sandbox.execute promises not to raise; a backend import error still can
            log.exception("sandbox failed")
            outcome = ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, f"the sandbox could not run: {type(exc).__name__}: {exc}",
                retriable=False, backend=self.env.backend or "",
            )  # fmt: skip
        return bridge.fetches.attach(outcome)  # provenance, and no egress error the host never replied

    def egress_broker(self) -> EgressBroker | str:
        """The broker this call's executions fetch through, or why they may not fetch (checked per execution:
        a policy that does not grant ``http_fetch`` reaches nothing, whatever broker the environment holds)."""
        if HTTP_FETCH not in self.env.policy.granted:
            return NO_GRANT
        return self.env.egress if self.env.egress is not None else broker_for(self.env.policy)

    def declare(self, frame: DeclareFrame, txn: Transaction) -> BridgeReply:
        """``delegate(...)`` ran: stage its contract with this attempt (committed only if the attempt is)."""
        target = frame.target
        checked = nested_call_spec(target, "declare")  # the same bounds on names and fields as a call's
        if isinstance(checked, str):
            return wire_error("invalid_contract", checked)
        try:
            contract = ToolContract(role=target.name, purpose=target.purpose, deliverable=target.deliverable,
                                    acceptance=target.acceptance, failure_policy=target.failure_policy,
                                    files=checked.files)  # fmt: skip
            check_contract(contract)
        except (InvalidContract, ValidationError) as exc:
            return wire_error("invalid_contract", bounded(str(exc), 2000) or "")
        except Exception as exc:
            log.exception("declaring %s failed in the host", target.name)
            return wire_error("internal_error", f"the host failed to stage the contract: {type(exc).__name__}")
        txn.register(contract)
        return _STAGED

    def nested(self, frame: CallFrame, txn: Transaction) -> BridgeReply:
        """Answer one ``tool(...)``/``delegate(...)`` method call made by the running program.

        It draws on the trace budget and gets at most the time this execution has left. A delegate's
        contract is registered only if the nested call succeeds (a failed one leaves no tool behind)."""
        self.nested_calls += 1
        try:
            return self._nested(frame, txn)
        except Exception as exc:
            log.exception("nested call %s.%s failed in the host", frame.target.name, frame.method)
            return wire_error("internal_error", f"the host failed to run the nested call: {type(exc).__name__}")

    def _nested(self, frame: CallFrame, txn: Transaction) -> BridgeReply:
        max_depth = self.env.budgets.max_depth
        if self.spec.depth + 1 > max_depth:
            return wire_error("max_depth_exceeded", f"nested calls are limited to depth {max_depth}")
        spec = nested_call_spec(frame.target, frame.method)
        if isinstance(spec, str):
            return wire_error(INVALID_TOOL_CALL, spec)
        problem = json_problem(list(frame.args), "the nested call's arguments") or json_problem(
            dict(frame.kwargs), "the nested call's keyword arguments"
        )
        if problem is not None:
            return wire_error(INVALID_TOOL_CALL, problem)
        deadline = serving_deadline() or self.exec_deadline  # the deadline the exchange enforces
        stop = self.meter.charge("nested_call", deadline)
        if stop is not None:
            self.nested_extrinsic.add(stop.error_type)  # the trace budget is the caller's, never the program's
            return wire_error(stop.error_type, stop.message)
        return self._run_child(spec, frame, txn, deadline)

    def _run_child(self, spec: NestedCallSpec, frame: CallFrame, txn: Transaction,
                   deadline: float | None) -> BridgeReply:  # fmt: skip
        scope = Transaction(self.env.state, parent=txn)  # holds the contract until the call succeeds
        if spec.kind == "delegate":
            scope.register(
                ToolContract(role=spec.role, purpose=spec.purpose, deliverable=spec.deliverable,
                             acceptance=spec.acceptance, failure_policy=spec.failure_policy, files=spec.files)
            )  # fmt: skip
        files = handed_files(frame, self.env.limits, scope.contract(spec.role))
        if isinstance(files, str):
            return wire_error(INVALID_TOOL_CALL, files)
        child = CallSpec(
            role=spec.role, method=spec.method, args=list(frame.args), kwargs=dict(frame.kwargs),
            depth=self.spec.depth + 1, trace_id=self.spec.trace_id, parent_call_id=self.spec.call_id,
            call_deadline=deadline, files=files, returns_files="files" in frame.model_fields_set,
        )  # fmt: skip
        outcome = self.run_nested(child, scope)
        if self.fetches is not None:
            call = {"call_id": child.call_id, "role": child.role, "method": child.method, "depth": child.depth}
            self.fetches.nested(call, outcome.metadata)
        if not outcome.ok:
            if outcome.metadata.get("failure_class") == "extrinsic" and outcome.error_type:
                self.nested_extrinsic.add(outcome.error_type)
            scope.tools.clear()  # its record stays (the caller may still succeed); its contract does not
            if spec.kind == "delegate":
                txn.tools.pop(spec.role, None)  # nor the one its ``declare`` frame staged in this attempt
        scope.commit()
        reply = BridgeReply.of(outcome.to_wire())  # the envelope checked, the value sent as it is
        if outcome.ok and outcome.files:  # only a call_with_files callee's (``returns_files``)
            # a call_with_files callee that committed: its outputs go to the caller's outputs/ (base64)
            handed = {name: base64.b64encode(body).decode() for name, body in outcome.files.items()}
            reply = reply.model_copy(update={"files": handed})
        return reply


def handed_files(frame: CallFrame, limits: Limits, contract: ToolContract | None) -> dict[str, bytes] | str:
    """The files a ``call_with_files`` frame hands its callee, decoded and checked as a top-level call's are
    (the run's ``Limits``, the callee's declared media types), or why they are refused (one line). A plain
    nested call hands none: the callee sees no file it was not given."""
    if not frame.files:
        return {}
    try:
        decoded = {name: base64.b64decode(text, validate=True) for name, text in frame.files.items()}
    except (binascii.Error, ValueError):
        return "call_with_files: a file handed on is not base64"
    try:
        checked = ExecutionRequest(code="", files=decoded, limits=limits).files
    except ValidationError as exc:
        return f"call_with_files: {bounded(str(exc.errors()[0].get('msg', 'invalid')), 500)}"
    problem = check_inputs(contract.files if contract is not None else None, checked)
    return problem if problem is not None else checked


@dataclass
class AttemptBridge:
    """Answers the running program's nested calls, ``delegate(...)`` declarations and fetches for one attempt."""

    executor: Executor
    txn: Transaction
    fetches: ExecutionEgress

    def __call__(self, frame: CallFrame) -> BridgeReply:
        return self.executor.nested(frame, self.txn)

    def declare(self, frame: DeclareFrame) -> BridgeReply:
        return self.executor.declare(frame, self.txn)

    def egress(self, request: bytes, deadline: float) -> bytes:
        """A fetch of the running program (a ``FetchRequest`` as JSON), brokered under the call's policy."""
        return self._traced(lambda: self.fetches.egress(request, deadline))

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]:
        """:meth:`egress` with the response's body as raw bytes (the exchange prefers it: no base64)."""
        return self._traced(lambda: self.fetches.egress_parts(request, deadline))

    def egress_request(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[dict[str, Any], bytes | PipedBody | None]:
        """:meth:`egress_parts` on the frame the exchange already parsed (the exchange prefers it)."""
        return self._traced(lambda: self.fetches.egress_request(request, deadline))

    def _traced(self, fetch: Callable[[], T]) -> T:
        """One fetch, as a client span when telemetry is on (every egress entry point goes through here)."""
        tel = telemetry()
        if not tel.enabled:
            return fetch()
        with observe.egress_span(tel) as span:
            answer = fetch()
            observe.egress_ended(tel, span, self._last_record())
        return answer

    def _last_record(self) -> dict[str, Any] | None:
        records = self.fetches.records  # a program's fetches are one at a time: the last one is this one
        return records[-1].model_dump(mode="json") if records else None
