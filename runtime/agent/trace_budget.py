"""The per-trace budget: what one top-level call may spend in all, however many nested calls it makes.

The lane budgets (:class:`~runtime.agent.budgets.Budgets`) bound the retries of *one* call; without a
budget per trace, a program fanning out 3 ways 4 levels deep made 121 provider calls and sandboxes for one
request (up to 847 paid generations with every lane's retries). So every call of a trace (the top-level
call and each nested call under it) draws from one :class:`TraceMeter`:

- ``max_nested_calls``: nested ``tool(...)``/``delegate(...)`` method calls answered,
- ``max_provider_calls``: generations, counting regenerations and repairs,
- ``max_sandboxes``: program executions,
- ``max_wall_s``: wall-clock seconds from the top-level call's start.

Exhaustion is an outcome, never an exception: ``error_type`` ``budget_exhausted`` with the limit named in
``metadata["budget_limit"]``. Time is also charged down the tree: a nested call never runs past the
deadline of the execution that made it (see :meth:`TraceMeter.execution_window`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandforge.runtime.errors import ConfigError

ChargeKind = Literal["nested_call", "provider_call", "sandbox"]
BudgetLimit = Literal["max_nested_calls", "max_provider_calls", "max_sandboxes", "max_wall_s"]

#: Environment variables overriding the defaults (``SANDFORGE_TRACE_MAX_PROVIDER_CALLS=50`` ...).
ENV_PREFIX = "SANDFORGE_TRACE_"

#: An execution with less than this much of its caller's time left is not started: it could not finish.
MIN_EXECUTION_S = 0.05

BUDGET_EXHAUSTED = "budget_exhausted"


class TraceBudgetError(ConfigError, ValueError):
    """A trace budget setting (usually a ``SANDFORGE_TRACE_*`` variable) is invalid: one line in the CLI."""


class TraceBudget(BaseModel):
    """Limits of one trace (a top-level call and all its nested calls). Defaults fit an interactive call
    with a handful of nested tools, each allowed its retries; raise them for wide delegation trees."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_nested_calls: int = Field(20, ge=0, le=10_000, description="nested tool()/delegate() calls in the trace")
    max_provider_calls: int = Field(
        24, ge=1, le=10_000, description="provider generations in the trace, regenerations and repairs included"
    )
    max_sandboxes: int = Field(40, ge=1, le=10_000, description="program executions in the trace")
    max_wall_s: float = Field(300.0, gt=0, le=86_400, description="wall-clock seconds from the top-level call's start")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> TraceBudget:
        """Defaults, then ``SANDFORGE_TRACE_<FIELD>`` variables, then ``overrides``; a bad value is a
        :class:`TraceBudgetError` (a ValueError and a ConfigError)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw.strip():
                values[name] = raw.strip()
        values.update(overrides)
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise TraceBudgetError(
                f"invalid trace budget {where}: {err['msg']}", hint=f"check {ENV_PREFIX}{where.upper()}"
            ) from None


class TraceUsage(BaseModel):
    """What a trace had spent when a call ended (logged on every call record of the trace)."""

    model_config = ConfigDict(extra="forbid")

    nested_calls: int = 0
    provider_calls: int = 0
    sandboxes: int = 0
    wall_s: float = 0.0
    exhausted: BudgetLimit | None = Field(None, description="the first limit the trace ran into, if any")


class BudgetStop(Exception):
    """Raised inside the lifecycle where a unit cannot be spent; it becomes the call's error outcome."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.message)
        self.stop = stop


@dataclass(frozen=True)
class Stop:
    """Why a call may not spend more: an outcome's ``error_type``, message and metadata."""

    error_type: str
    message: str
    limit: BudgetLimit | None = None

    def metadata(self) -> dict[str, Any]:
        return {"failure_class": "extrinsic", **({"budget_limit": self.limit} if self.limit else {})}


@dataclass
class TraceMeter:
    """The running account of one trace; shared by every call in it (nested calls run on the caller's
    thread, but a lock keeps the counts exact if a provider or store ever calls back concurrently)."""

    budget: TraceBudget
    started: float = field(default_factory=time.monotonic)
    nested_calls: int = 0
    provider_calls: int = 0
    sandboxes: int = 0
    exhausted: BudgetLimit | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def deadline(self) -> float:
        return self.started + self.budget.max_wall_s

    def usage(self) -> TraceUsage:
        return TraceUsage(
            nested_calls=self.nested_calls, provider_calls=self.provider_calls, sandboxes=self.sandboxes,
            wall_s=round(time.monotonic() - self.started, 6), exhausted=self.exhausted,
        )  # fmt: skip

    def _exhaust(self, limit: BudgetLimit, what: str) -> Stop:
        if self.exhausted is None:
            self.exhausted = limit
        value = getattr(self.budget, limit)
        return Stop(BUDGET_EXHAUSTED, f"the trace budget is exhausted: {what} (limit {limit}={value:g})", limit)

    def _time_stop(self, call_deadline: float | None, now: float, need: float) -> Stop | None:
        if now + need > self.deadline:
            return self._exhaust("max_wall_s", "no wall-clock time left in the trace")
        if call_deadline is not None and now + need > call_deadline:
            return Stop("timeout", "the calling program's time limit left no time for this nested call")
        return None

    def charge(self, kind: ChargeKind, call_deadline: float | None) -> Stop | None:
        """Spend one unit of ``kind``; a Stop (and nothing spent) if the count or the time is used up.

        ``call_deadline`` is when the calling execution's time runs out (None at the top level)."""
        need = MIN_EXECUTION_S if kind == "sandbox" else 0.0
        with self._lock:
            stop = self._time_stop(call_deadline, time.monotonic(), need)
            if stop is not None:
                return stop
            if kind == "nested_call":
                if self.nested_calls >= self.budget.max_nested_calls:
                    return self._exhaust("max_nested_calls", f"{self.nested_calls} nested calls made")
                self.nested_calls += 1
            elif kind == "provider_call":
                if self.provider_calls >= self.budget.max_provider_calls:
                    return self._exhaust("max_provider_calls", f"{self.provider_calls} provider calls made")
                self.provider_calls += 1
            else:
                if self.sandboxes >= self.budget.max_sandboxes:
                    return self._exhaust("max_sandboxes", f"{self.sandboxes} sandboxes used")
                self.sandboxes += 1
        return None

    def execution_window(self, timeout_s: float, call_deadline: float | None) -> tuple[float, float, bool]:
        """``(seconds, deadline, by_trace)`` of an execution starting now: its own limit, cut to what the trace
        and the caller have left (``by_trace``: the trace's wall-clock budget is what ends it). Nested calls
        it makes must end by its deadline, so time spent in them is charged to it (the sandbox no longer
        extends its deadline while it waits for them)."""
        now = time.monotonic()
        own = now + timeout_s if call_deadline is None else min(now + timeout_s, call_deadline)
        deadline = min(own, self.deadline)
        return max(deadline - now, 0.0), deadline, self.deadline < own

    def time_left(self, call_deadline: float | None) -> float:
        """Seconds until the trace's or the caller's deadline, whichever is first (at least 1 ms)."""
        end = self.deadline if call_deadline is None else min(self.deadline, call_deadline)
        return max(end - time.monotonic(), 0.001)

    def wall_exhausted(self) -> Stop:
        """The Stop for an execution that the trace's wall-clock budget ended."""
        return self._exhaust("max_wall_s", "the trace ran out of wall-clock time while a program ran")
