"""What a provider is asked (GenerationRequest), what it answers (GeneratedProgram), and how it fails.

A provider turns one dynamic call (``calc.add(3)``) into a tool program: the *body* of a function with
``context``, ``args`` and ``kwargs`` in scope (see docs/architecture.md, "The program contract").
Retries are the lifecycle's business, never the provider's: on a retry the request carries the structured
feedback of every failed attempt so far.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sandforge.runtime.store.models import ToolContract

__all__ = [
    "AttemptFeedback", "FeedbackKind", "GeneratedProgram", "GenerationRequest", "InvalidProviderOutput", "Provider",
    "ProviderError", "RepairContext", "ToolContract",
]  # fmt: skip

FeedbackKind = Literal["generation", "guardrail", "execution", "outcome"]


class AttemptFeedback(BaseModel):
    """Why a previous attempt of this call failed, injected into the next generation (ADR 0016 section 4).

    ``guardrail`` feedback carries the violation fields; ``execution``/``outcome``/``generation`` feedback
    carries the error. It describes the mechanism that failed, never a domain answer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FeedbackKind
    attempt_number: int = Field(ge=1, description="the attempt that failed (1 = first)")
    remaining_budget: int = Field(ge=0, description="regenerations left in this lane after this one")
    violation_type: str | None = None
    violation_message: str | None = None
    violation_location: str | None = None
    required_correction: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    failure_class: str | None = None
    previous_code: str | None = None


class RepairContext(BaseModel):
    """A stored program to repair instead of writing one from scratch (ADR 0012 section 5).

    Only a repair request carries prior code: a fresh generation or regeneration never shows the model a
    stored program (it may be input-specific, tampered with or simply the wrong answer for this call).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior_code: str
    reason: str = Field(description="why it is repaired: a changed contract, degraded health, or a failure now")
    generation: int | None = Field(None, description="the stored generation being repaired")
    error_type: str | None = None
    error_message: str | None = None
    failure_class: str | None = None


class GenerationRequest(BaseModel):
    """Everything a provider needs to write the program for one dynamic call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    method: str
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    depth: int = 0
    attempt_number: int = 1
    context_keys: list[str] = Field(default_factory=list)
    context_summary: dict[str, str] = Field(
        default_factory=dict, description="context key -> type and a bounded preview of its value"
    )
    contract: ToolContract | None = None
    known_tools: list[ToolContract] = Field(default_factory=list)
    allowed_modules: list[str] = Field(default_factory=list)
    allowed_packages: list[str] = Field(
        default_factory=list, description="third-party distributions the policy allows programs to declare"
    )
    feedback: list[AttemptFeedback] = Field(default_factory=list)
    input_files: dict[str, int] = Field(
        default_factory=dict, description="the call's input files (issue 41): name -> size, read as inputs/NAME"
    )
    repair: RepairContext | None = Field(None, description="set only when the store asks for a repair")
    known_tools_block: str | None = Field(
        None, description="bounded <known_tools> block of the ToolStore (top-N by recency and utility)"
    )
    recent_patterns: str | None = Field(
        None, description="bounded <recent_patterns> block: depth-0 calls of dynamic methods only, never code"
    )
    time_budget_s: float | None = Field(
        None, gt=0, description="seconds the call has left (its caller's deadline, the trace's wall time): a "
        "provider that can should give up after that rather than answer a call that can no longer run",
    )  # fmt: skip


class GeneratedProgram(BaseModel):
    """A provider's answer: the program body plus what it says it depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    dependencies: list[str] = Field(default_factory=list)
    provider: str = ""
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


class ProviderError(Exception):
    """The provider could not answer. Always typed ``provider``; ``retriable`` says if later may work."""

    error_type = "provider"

    def __init__(self, message: str, *, retriable: bool = True, kind: str = "api_error") -> None:
        super().__init__(message)
        self.message = message
        self.retriable = retriable
        self.kind = kind


class InvalidProviderOutput(ProviderError):
    """The provider answered, but not with a usable program (no tool call, bad payload, syntax error).

    The lifecycle retries these within ``generation_retry_budget`` and no other budget.
    """

    error_type = "invalid_provider_output"

    def __init__(self, message: str, *, kind: str = "invalid_payload") -> None:
        super().__init__(message, retriable=True, kind=kind)


@runtime_checkable
class Provider(Protocol):
    """Generates one tool program per request. Raises ProviderError (or InvalidProviderOutput), nothing else."""

    name: str

    def generate(self, request: GenerationRequest) -> GeneratedProgram: ...
