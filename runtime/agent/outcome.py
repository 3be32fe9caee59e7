"""Outcome: what every dynamic call answers. A tool failure is an error Outcome, never an exception."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class Outcome(BaseModel):
    """Result of one dynamic call (``calc.add(3)``), at the top level or nested.

    ``error_type`` is a short snake_case word: the sandbox's failure types (``timeout``, ``execution``, ...),
    the program's own ``Outcome.error`` type (``division_by_zero``), or the lifecycle's
    (``guardrail_violation``, ``guardrail_retry_exhausted``, ``outcome_repair_retry_exhausted``,
    ``generation_retry_exhausted``, ``provider``). ``metadata`` holds diagnostics (attempt failures,
    violations, call and trace ids); the user-facing ``error_message`` never carries failed-attempt details.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["ok", "error"]
    value: JsonValue = None
    error_type: str | None = None
    error_message: str | None = None
    retriable: bool = False
    tool_role: str
    method_name: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: the ``outputs/`` files of the attempt that succeeded (committed with its context); ``{}`` for an error
    #: and for a nested call's outcome. Never in a dump (``model_dump``/JSON): the call log lists their
    #: names, sizes and sha256 (``output_files``), and each edge says how it hands files on (docs/files.md)
    files: dict[str, bytes] = Field(default_factory=dict, exclude=True, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_wire(self) -> dict[str, Any]:
        """The dict a program inside the sandbox receives for a nested call."""
        return {
            "status": self.status,
            "value": self.value,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "retriable": self.retriable,
        }

    def __str__(self) -> str:
        call = f"{self.tool_role}.{self.method_name}"
        if self.ok:
            return f"{call} -> ok {self.value!r}"
        again = ", retriable" if self.retriable else ""
        return f"{call} -> error [{self.error_type}{again}] {self.error_message}"
