"""What validation returns: a verdict, the violations behind it, and the capabilities the program uses.

Every model here crosses a boundary (CLI JSON, the lifecycle's retry feedback, logs), so they are pydantic
models; ``ValidationResult.model_dump(mode="json")`` is the wire form.
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Classification = Literal["recoverable", "terminal"]
"""ADR 0016: *recoverable* means a rewrite of the program can fix it (the default); *terminal* means no
rewrite can (an ungranted capability, missing credentials, an unavailable service)."""

Verdict = Literal["approved", "recoverable", "terminal"]

#: Violation types produced by the engine itself rather than by a policy rule.
INVALID_CODE = "invalid_code"
SOURCE_TOO_LARGE = "source_too_large"
NESTING_TOO_DEEP = "nesting_too_deep"
GUARDRAIL_ERROR = "guardrail_error"
#: What the sandbox's restricted compiler refuses (the same compilation the sandbox runs; issue 15).
SANDBOX_RESTRICTION = "sandbox_restriction"
#: A literal URL in a fetching call that the policy's egress rules deny (issue 18; ``egress_literals.py``).
EGRESS_DENIED = "egress_denied"
#: ``urllib.request``/``requests`` used beyond the sandbox's stand-ins (issue 18; ``fetch_surface.py``).
UNSUPPORTED_FETCH_API = "unsupported_fetch_api"


class Location(BaseModel):
    """Where a violation is, in the program's own coordinates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    line: int = Field(ge=1, description="1-based line number")
    column: int = Field(ge=1, description="1-based column, counted in characters (code points)")
    end_line: int | None = Field(None, ge=1)
    end_column: int | None = Field(None, ge=1, description="exclusive end column, in characters")
    source_line: str = Field("", description="the program's text on `line` (long lines are truncated)")


class Violation(BaseModel):
    """One broken rule. The first five fields are ADR 0016's structured retry feedback."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    violation_type: str = Field(description="the rule id, or an engine type such as `invalid_code`")
    message: str
    location: Location | None = None
    classification: Classification
    required_correction: str = Field(description="a policy-preserving rewrite instruction, never domain logic")


with warnings.catch_warnings():
    # `construct` is the issue's word for the field; it shadows pydantic v1's deprecated classmethod only.
    warnings.filterwarnings("ignore", message='Field name "construct"', category=UserWarning)

    class Evidence(BaseModel):
        """One construct that shows a capability is used."""

        model_config = ConfigDict(frozen=True, extra="forbid")

        line: int = Field(ge=1)
        column: int = Field(ge=1)
        construct: str = Field(description="the matched source text, e.g. `import urllib.request`")  # type: ignore[assignment]


class Capability(BaseModel):
    """A capability tag the program uses, with the constructs that show it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: str
    granted: bool = Field(description="whether the policy grants it; an ungranted tag is a terminal violation")
    evidence: list[Evidence]


class ValidationResult(BaseModel):
    """The outcome of `validate`: terminal wins over recoverable, which wins over approved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    violations: list[Violation] = Field(default_factory=list)
    capabilities: list[Capability] = Field(default_factory=list)
    policy_name: str
    policy_fingerprint: str
    truncated: bool = Field(False, description="more violations were found than the policy's max_violations")

    @property
    def approved(self) -> bool:
        return self.verdict == "approved"

    @property
    def capability_tags(self) -> list[str]:
        return [capability.tag for capability in self.capabilities]


def verdict_of(violations: list[Violation]) -> Verdict:
    """Terminal if any violation is terminal, else recoverable if there is any, else approved."""
    if any(v.classification == "terminal" for v in violations):
        return "terminal"
    return "recoverable" if violations else "approved"
