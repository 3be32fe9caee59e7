"""The program-source seam: the single place where a call's program comes from.

Today every program is ``generated`` by the provider. A ToolStore plugs in as a :class:`ProgramStore`:
``lookup`` may answer the first attempt of a call with a ``persisted`` (or ``repaired``) program, which then
goes through exactly the same validate -> execute -> commit path, lanes and budgets as a generated one;
``record`` sees every committed call record (with the candidate that produced it) to update artifact
health or persist a new generation. Retries always regenerate with feedback.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from runtime.agent.calllog import CallRecord, ProgramSourceKind
from runtime.providers.base import GeneratedProgram, GenerationRequest


class ProgramCandidate(BaseModel):
    """A program about to be validated and executed, and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    source: ProgramSourceKind = "generated"
    dependencies: list[str] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    artifact_ref: str | None = Field(None, description="the store's id of a persisted/repaired artifact")

    @classmethod
    def from_generated(cls, program: GeneratedProgram) -> ProgramCandidate:
        return cls(
            code=program.code,
            source="generated",
            dependencies=list(program.dependencies),
            provider=program.provider or None,
            model=program.model,
        )


@runtime_checkable
class ProgramStore(Protocol):
    """What the lifecycle needs from a tool store. Exceptions it raises are logged and ignored."""

    def lookup(self, request: GenerationRequest) -> ProgramCandidate | None:
        """A persisted program for this call's first attempt, or None to generate one."""
        ...

    def record(self, candidate: ProgramCandidate | None, record: CallRecord) -> None:
        """Called once per committed call record (top-level calls always; nested ones with their parent)."""
        ...
