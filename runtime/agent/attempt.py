"""The current attempt of a call: its number, how far it got (ADR 0016 section 6) and what it ran."""

from __future__ import annotations

from dataclasses import dataclass

from sandforge.runtime.agent.calllog import AttemptStage
from sandforge.runtime.agent.source import ProgramCandidate
from sandforge.runtime.guardrails import ValidationResult
from sandforge.sandbox import ExecutionOutcome


@dataclass
class Attempt:
    """Reset by :meth:`next` at the start of each attempt; after the loop it describes the last one."""

    call_id: str
    number: int = 0
    stage: AttemptStage = "generated"
    candidate: ProgramCandidate | None = None
    validation: ValidationResult | None = None
    execution: ExecutionOutcome | None = None
    #: third-party modules the program imports, checked against its environment once it is prepared
    pending_imports: tuple[str, ...] = ()

    def next(self) -> None:
        self.number += 1
        self.stage = "generated"
        self.candidate, self.validation, self.execution = None, None, None
        self.pending_imports = ()

    @property
    def id(self) -> str:
        return f"{self.call_id}.{self.number}"
