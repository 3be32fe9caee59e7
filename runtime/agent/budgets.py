"""Retry budgets of the lifecycle (ADR 0016 section 5): one per failure class, never shared."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Budgets(BaseModel):
    """How many *re*-generations each lane may spend on one call (0 = no retry in that lane)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation_retry_budget: int = Field(
        2, ge=0, le=10, description="provider returned no usable program (bad payload, syntax error)"
    )
    guardrail_recovery_budget: int = Field(2, ge=0, le=10, description="recoverable guardrail violations")
    execution_repair_budget: int = Field(1, ge=0, le=10, description="the program raised while executing")
    fresh_outcome_repair_budget: int = Field(
        1, ge=0, le=10, description="the program returned a retriable, non-extrinsic Outcome.error"
    )
    max_depth: int = Field(4, ge=0, le=32, description="deepest nested call (top level is depth 0)")

    @classmethod
    def from_kwargs(cls, values: dict[str, Any]) -> Budgets:
        """Budgets from ``**budgets`` keyword arguments; an unknown or invalid one is a TypeError."""
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"])
            raise TypeError(f"invalid budget {name}: {err['msg']}") from None
