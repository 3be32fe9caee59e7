"""Where a call's programs come from: the store's plan on the first attempt, else the provider.

:meth:`ProgramSeam.obtain` is the only place the lifecycle gets a program (see ``runtime.agent.source``
for the store's side of the seam and docs/lifecycle.md, "Where programs come from").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.agent import observe
from sandforge.runtime.agent.attempt import Attempt
from sandforge.runtime.agent.calllog import AttemptFailure
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.source import ProgramCandidate, ProgramPlan, ProgramStore, PromptExtras
from sandforge.runtime.agent.trace_budget import BudgetStop, TraceMeter
from sandforge.runtime.providers.base import GenerationRequest, RepairContext
from sandforge.runtime.telemetry import current as telemetry

log = logging.getLogger(__name__)


@dataclass
class ProgramSeam:
    """One call's program source: what the store planned, what it added to prompts, what the provider did."""

    env: CallEnv
    spec: CallSpec
    meter: TraceMeter
    plan: ProgramPlan | None = None
    extras: PromptExtras | None = None
    extras_asked: bool = False
    repair_attempted: bool = False
    provider_calls: int = 0

    def obtain(self, request: GenerationRequest, at: Attempt, failures: list[AttemptFailure],
               retrying: bool) -> ProgramCandidate:  # fmt: skip
        """The store's plan (first attempt), else the provider.

        First attempt: a persisted candidate runs as is; a repair plan asks the provider to repair the
        prior code (``repaired``); otherwise generate. The attempt right after a failed persisted one
        repairs it when the plan allows (``repair_on_failure``); any later attempt regenerates.
        Raises :class:`BudgetStop` when the trace may not spend another provider call."""
        store = self.env.store
        if store is not None and at.number == 1 and not retrying:
            self.plan = self._lookup(store, request)
            if self.plan is not None and self.plan.candidate is not None:
                return self.plan.candidate
            if self.plan is not None and self.plan.repair is not None:
                return self._generate(request, self.plan.repair)
        elif (repair := self._repair_after_persisted_failure(at, failures)) is not None:
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

    def _repair_after_persisted_failure(self, at: Attempt, failures: list[AttemptFailure]) -> RepairContext | None:
        plan = self.plan
        if plan is None or plan.candidate is None or plan.repair_on_failure is None or at.number != 2:
            return None
        if not failures or failures[-1].program_source != "persisted":
            return None
        last = failures[-1]
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
            update["recent_patterns"] = extras.recent_patterns if self.spec.depth == 0 else None
        if request.contract is None and self.plan is not None and self.plan.contract is not None:
            update["contract"] = self.plan.contract
        if repair is not None:
            update["repair"] = repair
            self.repair_attempted = True
        if update:
            request = request.model_copy(update=update)
        stop = self.meter.charge("provider_call", self.spec.call_deadline)
        if stop is not None:
            raise BudgetStop(stop)
        request = request.model_copy(update={"time_budget_s": self.meter.time_left(self.spec.call_deadline)})
        self.provider_calls += 1
        model = getattr(self.env.provider, "model", None)
        with observe.generation(telemetry(), self.env.provider_name, model if isinstance(model, str) else None) as span:
            program = self.env.provider.generate(request)
            observe.generated(span, model=program.model, input_tokens=program.input_tokens,
                              output_tokens=program.output_tokens, repair=repair is not None)  # fmt: skip
        candidate = ProgramCandidate.from_generated(program)
        if repair is not None:
            candidate = candidate.model_copy(update={"source": "repaired"})
        return candidate
