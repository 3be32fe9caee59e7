"""ToolStoreSource: the ToolStore (``runtime.store``) as the lifecycle's program source.

``Workspace(store=ToolStore(...))`` / ``Agent.for_role(..., store=ToolStore(...))`` wrap the store in this
adapter. Per call (ADR 0012 sections 4 to 7 and 10, ADR 0013, the pattern-memory plan):

- lookup by ``role + method_name`` only: ``ToolStore.select`` with the call's contract fingerprint (the
  workspace's contract, else the one persisted for the role), the runtime version and the prompt version;
- ``execute_persisted``: the stored code as a ``persisted`` candidate; the lifecycle validates it with the
  CURRENT policy and runs it in the same sandbox as fresh code. If it fails and its lane retries, the retry
  is a repair of it (unless the artifact's repair budget is spent);
- ``repair``: the provider repairs the prior code, given why (changed contract, degraded health and the
  last failure); the result is ``repaired``;
- ``generate`` / ``regenerate`` (missing, corrupt, checksum mismatch, runtime-incompatible, dynamic method,
  non-cacheable, unproven, unhealthy, repair budget spent): generation from scratch, no stored code shown;
- prompts of generated or repaired calls get ``<known_tools>`` (top-N by recency and utility) and, at depth
  0 for dynamic methods, ``<recent_patterns>`` with the promotion nudge (labels and counts, never code);
- after the call (committed records only): persisted ok -> ``record_success``; persisted failure ->
  ``record_failure`` with the shared classification (only intrinsic failures count toward repair and
  regeneration; a non-retriable ``Outcome.error`` the program returned on purpose is the tool's answer, not
  a defect: recorded as adaptive unless extrinsic); a new program that succeeded -> ``record_regeneration``
  or ``record_repair`` with the runtime's cacheability verdict (``assess_cacheability``: dynamic methods,
  input-baked and argument-blind code are stored but never reused); the guardrail capabilities of every
  generated or repaired call -> ``record_pattern``;
- contracts committed by ``delegate(...)`` -> ``register_tool``; ``tool("name")`` of a role known only
  from the store gets its persisted contract.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.agent.calllog import CallRecord
from sandforge.runtime.agent.source import ProgramCandidate, ProgramPlan, PromptExtras
from sandforge.runtime.providers.base import GenerationRequest, RepairContext
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.store import (
    ArtifactCandidate,
    Decision,
    FailureClass,
    ProgramSource,
    Selection,
    SelectionReason,
    ToolContract,
    ToolStore,
    assess_cacheability,
    classify_failure,
    is_dynamic_method,
)
from sandforge.runtime.store.logfields import SELECTION_LOG_FIELDS

log = logging.getLogger(__name__)

#: Version of the program contract (docs/architecture.md) stored on artifacts. Artifacts written under
#: another MAJOR.MINOR are not executed (selection ``runtime_incompatible``); bump it when programs written
#: for the old contract may no longer run.
RUNTIME_VERSION = "0.1.0"
KNOWN_TOOLS_TOP_N = 10
#: The write-behind thread writes queued successes once no new one came for this long (a quiet moment,
#: so its file writes do not compete with the next call), and at the latest WRITE_BEHIND_MAX_DELAY_S
#: after the oldest one.
WRITE_BEHIND_DELAY_S = 0.05
WRITE_BEHIND_MAX_DELAY_S = 1.0
#: Error types of the lifecycle that mean the stored code was rejected by the current policy.
GUARDRAIL_ERRORS = frozenset({"guardrail_violation", "guardrail_retry_exhausted"})
_CLASSES = frozenset(c.value for c in FailureClass)


def artifact_failure_class(record: CallRecord) -> FailureClass:
    """How a failed call of a persisted program counts against its artifact (only INTRINSIC demotes it)."""
    if record.error_type in GUARDRAIL_ERRORS:
        if record.failure_class == FailureClass.EXTRINSIC.value:
            return FailureClass.EXTRINSIC  # only the caller's grants refused it (capability_not_granted)
        return FailureClass.INTRINSIC  # the current policy rejects the stored code itself: it cannot be used
    deliberate = record.tool_error and not record.retriable
    if record.failure_class in _CLASSES:
        cls = FailureClass(record.failure_class)
    else:
        cls = classify_failure(record.error_type)
    if deliberate and cls is FailureClass.INTRINSIC:
        return FailureClass.ADAPTIVE  # the program's own non-retriable Outcome.error: its answer, not a defect
    return cls


def _attempt_failure_class(failure_class: str | None) -> FailureClass:
    """The class of a failed attempt; guardrail verdicts (recoverable/terminal) and syntax are the code's fault."""
    return FailureClass(failure_class) if failure_class in _CLASSES else FailureClass.INTRINSIC


@dataclass(frozen=True)
class _Call:
    """What the adapter remembers of one call between lookup and record."""

    request: GenerationRequest
    selection: Selection
    contract: ToolContract | None

    @property
    def fingerprint(self) -> str | None:
        return self.contract.fingerprint() if self.contract is not None else None


_LIVE: weakref.WeakSet[ToolStoreSource] = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for source in list(_LIVE):
        try:
            source.close()
        except Exception:
            log.exception("could not write pending ToolStore successes at exit")


class ToolStoreSource:
    """A :class:`~runtime.agent.source.ProgramStore` over a :class:`~runtime.store.ToolStore` (module docstring).

    Write-behind (``write_behind=True``, the default): the success of a persisted call is bookkeeping the
    call's result does not depend on, and writing it durably (method file and registry, each fsynced) costs
    more than the sandbox run itself. So it is queued and written by a background thread, coalesced per
    ``(role, method, generation)`` (``record_success(count=n)``), once no success came for
    ``write_behind_delay`` (at the latest a second after the first). Order is kept: before any other write
    about a method (failure, repair, regeneration) its queued successes are written first. :meth:`flush`
    writes everything now; :meth:`close` (called by the workspace that created the source) and interpreter
    exit flush too. A crash can lose queued successes
    (counters undercount), never a failure, a new artifact or a contract.
    """

    def __init__(
        self,
        store: ToolStore,
        *,
        runtime_version: str = RUNTIME_VERSION,
        prompt_version: str = PROMPT_VERSION,
        known_tools_top_n: int = KNOWN_TOOLS_TOP_N,
        write_behind: bool = True,
        write_behind_delay: float = WRITE_BEHIND_DELAY_S,
    ) -> None:
        self.store = store
        self.runtime_version = runtime_version
        self.prompt_version = prompt_version
        self.known_tools_top_n = known_tools_top_n
        self.write_behind = write_behind
        self.write_behind_delay = write_behind_delay
        #: calls answered with a persisted program (for benchmarks and tests)
        self.served = 0
        self._pending: dict[tuple[str, str, int], int] = {}
        self._last_queued = 0.0
        # Queued successes are written through an instance of their own: a ToolStore's decode caches and
        # lock object are not meant to be shared by threads. Same directory, so the same data and file lock.
        self._success_store = ToolStore(store.paths.state_dir, policy=store.policy, clock=store.now)
        self._pending_lock = threading.Lock()
        self._write_lock = threading.RLock()  # held for every store write of this source: keeps their order
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._writer: threading.Thread | None = None
        _LIVE.add(self)
        store.add_write_behind(self)  # readers of this store (the dashboard) settle what is queued first

    # --- write-behind ----------------------------------------------------------------------------------

    def _defer_success(self, role: str, method: str, generation: int) -> None:
        with self._pending_lock:
            key = (role, method, generation)
            self._pending[key] = self._pending.get(key, 0) + 1
            self._last_queued = time.monotonic()
            if self._writer is None and not self._stopping.is_set():
                self._writer = threading.Thread(target=self._write_loop, name="toolstore-writer", daemon=True)
                self._writer.start()
        self._wake.set()

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._wait_for_a_quiet_moment()
            try:
                self.flush()
            except Exception:
                log.exception("writing pending ToolStore successes failed")
            if self._stopping.is_set():
                return

    def _wait_for_a_quiet_moment(self) -> None:
        """Until no success was queued for ``write_behind_delay`` (max WRITE_BEHIND_MAX_DELAY_S); close ends it."""
        if self.write_behind_delay <= 0:
            return
        deadline = time.monotonic() + max(WRITE_BEHIND_MAX_DELAY_S, self.write_behind_delay)
        while not self._stopping.is_set():
            quiet_at = self._last_queued + self.write_behind_delay
            now = time.monotonic()
            if now >= quiet_at or now >= deadline:
                return
            self._stopping.wait(min(quiet_at, deadline) - now)

    def flush(self, role: str | None = None, method: str | None = None) -> None:
        """Write queued successes now (all, or those of ``role.method``)."""
        with self._write_lock:
            with self._pending_lock:
                if role is None:
                    batch, self._pending = self._pending, {}
                else:
                    batch = {k: v for k, v in self._pending.items() if k[:2] == (role, method)}
                    for key in batch:
                        del self._pending[key]
            for (r, m, generation), count in batch.items():
                self._success_store.record_success(r, m, generation=generation, count=count)

    def close(self) -> None:
        """Stop the writer thread and write whatever is queued."""
        with self._pending_lock:
            self._stopping.set()
            writer, self._writer = self._writer, None
        self._wake.set()
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout=30)
        self.flush()

    # --- before the call -------------------------------------------------------------------------------

    def _persisted_contract(self, role: str) -> ToolContract | None:
        manifest = self.store.manifest(role)
        if manifest is not None:
            return manifest.contract
        entry = self.store.get_tool(role)
        return entry.contract() if entry is not None and entry.has_contract else None

    def lookup(self, request: GenerationRequest) -> ProgramPlan:
        role, method = request.role, request.method
        persisted = self._persisted_contract(role) if request.contract is None else None
        contract = request.contract or persisted
        selection = self.store.select(
            role,
            method,
            contract_fingerprint=contract.fingerprint() if contract is not None else None,
            runtime_version=self.runtime_version,
            prompt_version=self.prompt_version,
        )
        call = _Call(request=request, selection=selection, contract=contract)
        fields = selection.log_fields(program_source=ProgramSource.GENERATED).model_dump(
            mode="json", include=set(SELECTION_LOG_FIELDS)
        )
        candidate = repair = on_failure = None
        art = selection.artifact
        if selection.decision is Decision.EXECUTE_PERSISTED and art is not None:
            candidate = ProgramCandidate(
                code=art.code,
                source=ProgramSource.PERSISTED,
                dependencies=list(art.dependencies),
                environment=art.environment,
                provider="toolstore",
                model=art.model,
                artifact_ref=f"{role}.{method}@{art.generation}",
            )
            if art.repair_count_since_regen < self.store.policy.max_repairs_before_regen:
                on_failure = RepairContext(
                    prior_code=art.code, reason="the stored program failed on this call", generation=art.generation
                )
            self.served += 1
        elif selection.decision is Decision.REPAIR and art is not None:
            degraded = selection.reason is SelectionReason.DEGRADED
            repair = RepairContext(
                prior_code=art.code,
                reason=f"{selection.reason.value}: {selection.detail}",
                generation=art.generation,
                error_message=art.last_failure_reason if degraded else None,
                failure_class=art.last_failure_class.value if degraded and art.last_failure_class else None,
            )
        return ProgramPlan(
            candidate=candidate,
            repair=repair,
            repair_on_failure=on_failure,
            contract=persisted,
            log_fields=fields,
            prompt_extras=functools.partial(self._prompt_extras, call),
            on_record=functools.partial(self._on_record, call),
        )

    def _prompt_extras(self, call: _Call, request: GenerationRequest) -> PromptExtras:
        role, method, depth = request.role, request.method, request.depth
        shown = [role, *(t.role for t in request.known_tools)]
        known = self.store.known_tools_block(top_n=self.known_tools_top_n, exclude_roles=shown)
        patterns: str | None = None
        fields: dict[str, Any] = {}
        if depth == 0 and is_dynamic_method(method, self.store.policy.dynamic_methods):
            patterns = self.store.recent_patterns_block(role, method, depth=depth)
            signal = self.store.promotion_signal(role, method)
            fields = {
                "promotion_candidate_detected": signal.detected,
                "promotion_candidate_capabilities": list(signal.capabilities),
            }
        return PromptExtras(known_tools_block=known, recent_patterns=patterns, log_fields=fields)

    # --- after the call --------------------------------------------------------------------------------

    def record(self, candidate: ProgramCandidate | None, record: CallRecord) -> CallRecord | None:
        """A call without a plan (its lookup failed): nothing is known about its artifact; not recorded."""
        log.debug("call %s had no store plan; not recorded in the store", record.call_id)
        return None

    def register_tool(self, contract: ToolContract) -> None:
        """Persist a committed contract (``delegate(...)``), unless the store already has this one."""
        wanted = contract.bounded()
        manifest = self.store.manifest(contract.role)
        stored = manifest.contract if manifest is not None else None
        if stored is not None and stored.fingerprint() == wanted.fingerprint():
            return
        self.store.register_tool(wanted)

    def _on_record(self, call: _Call, candidate: ProgramCandidate | None, record: CallRecord) -> CallRecord:
        persisted = call.selection.artifact if call.selection.decision is Decision.EXECUTE_PERSISTED else None
        if persisted is not None and record.program_source == "persisted" and record.status == "ok":
            if self.write_behind and not self._stopping.is_set():
                self._defer_success(record.role, record.method, persisted.generation)
            else:
                with self._write_lock:
                    self.flush(record.role, record.method)
                    self.store.record_success(record.role, record.method, generation=persisted.generation)
            return record.model_copy(
                update={
                    "store_actions": [f"record_success@{persisted.generation}"],
                    "cacheable": persisted.cacheable,
                    "cacheability_reason": persisted.cacheability_reason,
                    "input_sensitive": persisted.input_sensitive,
                }
            )
        with self._write_lock:
            self.flush(record.role, record.method)  # queued successes happened first: keep that order
            return self._record_now(call, candidate, record)

    def _record_now(self, call: _Call, candidate: ProgramCandidate | None, record: CallRecord) -> CallRecord:
        actions: list[str] = []
        update: dict[str, Any] = {}
        self._record_persisted_failure(call, record, actions, update)
        if (
            candidate is not None
            and candidate.source in ("generated", "repaired")
            and record.program_source == candidate.source
        ):
            self._record_fresh(call, candidate, record, actions, update)
        update["store_actions"] = actions
        return record.model_copy(update=update)

    def _record_persisted_failure(
        self, call: _Call, record: CallRecord, actions: list[str], update: dict[str, Any]
    ) -> None:
        """The persisted program this call selected failed: its health learns why."""
        role, method, selection = record.role, record.method, call.selection
        persisted = selection.artifact if selection.decision is Decision.EXECUTE_PERSISTED else None
        if persisted is None:
            return
        gen = persisted.generation
        if record.program_source == "persisted":  # it failed (its success is handled by _on_record)
            cls = artifact_failure_class(record)
            reason = f"{record.error_type}: {record.error_message or ''}"
            self.store.record_failure(role, method, cls, reason, generation=gen)
            actions.append(f"record_failure:{cls.value}@{gen}")
            update |= {
                "cacheable": persisted.cacheable,
                "cacheability_reason": persisted.cacheability_reason,
                "input_sensitive": persisted.input_sensitive,
            }
        else:  # it failed on an earlier attempt and was replaced by a repair or regeneration
            failed = next((f for f in record.attempt_failures if f.program_source == "persisted"), None)
            if failed is not None:
                cls = _attempt_failure_class(failed.failure_class)
                self.store.record_failure(
                    role, method, cls, f"{failed.error_class}: {failed.error_message}", generation=gen
                )
                actions.append(f"record_failure:{cls.value}@{gen}")

    def _record_fresh(
        self, call: _Call, candidate: ProgramCandidate, record: CallRecord, actions: list[str], update: dict[str, Any]
    ) -> None:
        """A generated or repaired program ran: its capability pattern, and (on success) the new artifact."""
        role, method, store = record.role, record.method, self.store
        labels = sorted({c.tag for c in record.capabilities})
        if record.verdict is not None:  # validated: the guardrail engine extracted its capabilities
            store.record_pattern(role, method, labels, ok=record.status == "ok", error_type=record.error_type)
            actions.append("record_pattern")
            update["capability_patterns"] = labels
        if record.status != "ok":
            return
        verdict = assess_cacheability(
            method,
            candidate.code,
            call.request.args,
            call.request.kwargs,
            is_delegated_contract=call.contract is not None,
            dynamic_methods=store.policy.dynamic_methods,
            contract=call.contract.model_dump(mode="json") if call.contract is not None else None,
        )
        new = ArtifactCandidate(
            role=role,
            method_name=method,
            code=candidate.code,
            runtime_version=self.runtime_version,
            cacheability=verdict,
            dependencies=list(candidate.dependencies),
            environment=candidate.environment,
            prompt_version=self.prompt_version,
            model=candidate.model,
            contract_fingerprint=call.fingerprint,
            capabilities=labels,
        )
        if candidate.source == "repaired":
            art = store.record_repair(new)
            actions.append(f"record_repair@{art.generation}")
        else:
            art = store.record_regeneration(new)
            actions.append(f"record_regeneration@{art.generation}")
        update |= {
            "cacheable": verdict.cacheable,
            "cacheability_reason": verdict.reason_text,
            "input_sensitive": verdict.input_sensitive,
        }
