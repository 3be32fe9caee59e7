"""The ToolStore's fields of a call-log record, declared once (ADR 0012 section 10, ADR 0013, pattern memory).

The call record (``runtime.agent.calllog.CallRecord``) inherits them, so they stay flat in its JSON (the
published call-log schema is unchanged); the selection's view of one call (``CallLogFields``) extends them
with the store's enums; ``STORE_LOG_FIELDS`` and ``SELECTION_LOG_FIELDS`` are derived from this model
instead of being listed again.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from sandforge.runtime.store.kinds import ProgramSource

#: A program source as the call log publishes it: a plain string enumeration in its JSON Schema.
ProgramSourceField = Annotated[
    ProgramSource, WithJsonSchema({"enum": sorted(s.value for s in ProgramSource), "type": "string"})
]


class StoreLogFields(BaseModel):
    """What the store saw of the stored artifact and what it did, for one call. Defaults without a store. A base
    (of the call record and the selection's view), never validated itself: its own validator is never built."""

    model_config = ConfigDict(defer_build=True)

    # ToolStore (ADR 0012 section 10): what the selector saw of the stored artifact.
    artifact_hit: bool = Field(False, description="an intact, runtime-compatible artifact was found")
    artifact_generation: int | None = None
    artifact_prompt_version: str | None = None
    artifact_contract_fingerprint: str | None = None
    artifact_success_count: int | None = None
    artifact_failure_count: int | None = None
    artifact_intrinsic_failure_count: int | None = None
    artifact_extrinsic_failure_count: int | None = None
    artifact_cacheable: bool | None = None
    artifact_cacheability_reason: str | None = None
    artifact_input_sensitive: bool | None = None
    selection_decision: str | None = Field(None, description="generate | execute_persisted | repair | regenerate")
    selection_reason: str | None = None
    repair_attempted: bool = Field(False, description="the provider was asked to repair a stored program")
    repair_succeeded: bool = Field(False, description="the call succeeded with the repaired program")
    # ADR 0013: the runtime's cacheability verdict on the program that ran (stored artifact or new code)
    cacheable: bool | None = None
    cacheability_reason: str | None = None
    input_sensitive: bool | None = None
    # pattern memory (plan phases 1 and 4)
    capability_patterns: list[str] = Field(default_factory=list)
    promotion_candidate_detected: bool = False
    promotion_candidate_capabilities: list[str] = Field(default_factory=list)
    store_actions: list[str] = Field(
        default_factory=list, description="what the store recorded, e.g. record_success@2, record_failure:extrinsic@2"
    )


#: Every field a program store may fill in on a call record.
STORE_LOG_FIELDS: frozenset[str] = frozenset(StoreLogFields.model_fields)
#: The fields the selection knows before the call runs (the rest are known only after it).
SELECTION_LOG_FIELDS: frozenset[str] = frozenset(
    name for name in STORE_LOG_FIELDS if name == "artifact_hit" or name.startswith(("artifact_", "selection_"))
)
