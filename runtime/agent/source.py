"""The program-source seam: the single place where a call's program comes from.

Without a store every program is ``generated`` by the provider. A store plugs in as a
:class:`ProgramStore` (``runtime.agent.persistence.ToolStoreSource`` wraps a ``runtime.store.ToolStore``;
``Workspace(store=ToolStore(...))`` does that by itself):

- ``lookup(request)`` is asked on the first attempt of every call. It answers None (generate), a
  :class:`ProgramCandidate` (run it), or a :class:`ProgramPlan`:

  * ``plan.candidate``: a ``persisted`` program to run. It goes through exactly the same syntax check,
    validation (the current policy), sandbox, lanes and commit as a generated one;
  * ``plan.repair``: ask the provider to *repair* this prior code (``GenerationRequest.repair``: prior
    code plus failure context); the program it returns is ``repaired``;
  * neither: generate from scratch. The provider never sees stored code then.

  A plan also carries the contract to use when the call has none (a tool known from an earlier session),
  call-log fields (``log_fields``), ``prompt_extras`` (asked once, before the call's first provider
  request: ``<known_tools>``, ``<recent_patterns>``) and ``repair_on_failure``: when the persisted program
  fails and its lane retries, the retry is a repair of it with that failure as context (a failed repair
  falls back to full regeneration on the next retry, within the same lane budgets).
- ``record(candidate, record)`` sees every committed call record (top-level calls always, nested ones when
  their parent's attempt commits) with the candidate of its last attempt; when the call had a plan with
  ``on_record``, that is called instead (it knows the call's arguments and selection). Either may return
  an updated record (only :data:`~runtime.agent.calllog.STORE_FIELDS` changed), which is what the call log
  then gets.
- optional ``register_tool(contract)``: contracts committed by ``delegate(...)`` or
  ``Workspace.register_tool`` are handed to it.

Store exceptions are logged and ignored: a broken store degrades to fresh generation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.agent.calllog import CallRecord
from sandforge.runtime.environments.identity import EnvironmentSpec
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, RepairContext
from sandforge.runtime.store.models import ProgramSource, ToolContract


class ProgramCandidate(BaseModel):
    """A program about to be validated and executed, and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    source: ProgramSource = ProgramSource.GENERATED
    dependencies: list[str] = Field(default_factory=list)
    #: the environment a persisted program was stored with (or the one this attempt prepared): issue 19
    environment: EnvironmentSpec | None = None
    provider: str | None = None
    model: str | None = None
    artifact_ref: str | None = Field(None, description="the store's id of a persisted/repaired artifact")

    @classmethod
    def from_generated(cls, program: GeneratedProgram) -> ProgramCandidate:
        return cls(
            code=program.code,
            source=ProgramSource.GENERATED,
            dependencies=list(program.dependencies),
            provider=program.provider or None,
            model=program.model,
        )


class PromptExtras(BaseModel):
    """What a store adds to the generation requests of one call, and the log fields that go with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    known_tools_block: str | None = None
    recent_patterns: str | None = None
    log_fields: dict[str, Any] = Field(default_factory=dict)


RecordHook = Callable[["ProgramCandidate | None", CallRecord], "CallRecord | None"]


@dataclass(frozen=True)
class ProgramPlan:
    """A store's answer for one call (see the module docstring). ``candidate`` and ``repair`` exclude each other."""

    candidate: ProgramCandidate | None = None
    repair: RepairContext | None = None
    #: If the persisted candidate fails and its lane retries: repair it (the lifecycle adds the failure).
    repair_on_failure: RepairContext | None = None
    #: The tool's contract when the call has none in this workspace (materialized from the store).
    contract: ToolContract | None = None
    log_fields: Mapping[str, Any] = field(default_factory=dict)
    prompt_extras: Callable[[GenerationRequest], PromptExtras] | None = None
    on_record: RecordHook | None = None

    def __post_init__(self) -> None:
        if self.candidate is not None and self.repair is not None:
            raise ValueError("a plan either runs a candidate or asks for a repair, not both")


@runtime_checkable
class ProgramStore(Protocol):
    """What the lifecycle needs from a tool store. Exceptions it raises are logged and ignored."""

    def lookup(self, request: GenerationRequest) -> ProgramCandidate | ProgramPlan | None:
        """What to run for this call's first attempt: a plan, a persisted program, or None to generate."""
        ...

    def record(self, candidate: ProgramCandidate | None, record: CallRecord) -> CallRecord | None:
        """Called once per committed call record without a plan hook; may return an updated record."""
        ...
