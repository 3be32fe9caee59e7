"""pydantic models of every ToolStore record, and the enums the policy speaks in.

Every persisted document carries ``schema_version``; so do the registry entries and method artifacts inside
them (each is a record of its own). Older versions are migrated on load (``runtime.store.migrations``),
newer ones are refused with :class:`~runtime.store.errors.SchemaTooNewError`.

Records are frozen: change one with ``model_copy(update=...)`` (the health functions do).
Unknown keys in a current-version file are ignored (and dropped on the next write), not a reason to
quarantine the file.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

from sandforge.runtime.environments.identity import EnvironmentSpec
from sandforge.runtime.names import MAX_CONTRACT_FIELD_CHARS, MAX_PURPOSE_CHARS
from sandforge.runtime.store.fingerprint import code_checksum, contract_fingerprint
from sandforge.runtime.store.kinds import FailureClass as FailureClass  # defined apart: see kinds.py
from sandforge.runtime.store.kinds import ProgramSource as ProgramSource

REGISTRY_SCHEMA_VERSION = 2
MANIFEST_SCHEMA_VERSION = 2
ARTIFACT_SCHEMA_VERSION = 2
PATTERNS_SCHEMA_VERSION = 1

#: Generations kept besides the current one per (role, method): ADR 0012 section 8, "latest + previous 2".
RETAINED_PREVIOUS = 2
#: Outcomes (success / intrinsic failure) remembered per artifact to compute ``recent_failure_rate``.
HEALTH_WINDOW = 20
#: Recent answers (successes and adaptive failures) remembered per artifact: repeated adaptive failures
#: (the program keeps answering ``Outcome.error`` on real inputs) degrade it (``SelectionPolicy``).
ADAPTIVE_WINDOW = 5
#: Longest failure reason stored (the rest is cut, with an ellipsis).
MAX_REASON_CHARS = 500


def _clip_purpose(value: Any) -> Any:
    """A purpose longer than the bound (written before it existed, or by hand) is cut, never kept whole:
    the registry feeds prompts (issue 13 item 7)."""
    if isinstance(value, str) and len(value) > MAX_PURPOSE_CHARS:
        return value[: MAX_PURPOSE_CHARS - 1] + "…"
    return value


def _clip_json(value: Any) -> Any:
    """A contract field whose JSON is longer than the bound becomes a marker with a bounded preview."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return value  # not JSON: the JsonValue validation refuses it
    if len(text) <= MAX_CONTRACT_FIELD_CHARS:
        return value
    return {"truncated": True, "chars": len(text), "preview": text[: MAX_CONTRACT_FIELD_CHARS // 2]}


#: Contract text as the store keeps it: bounded (see ``runtime.names``).
Purpose = Annotated[str | None, BeforeValidator(_clip_purpose)]
ContractField = Annotated[JsonValue, BeforeValidator(_clip_json)]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


#: A declared file: a name in ``inputs/`` or ``outputs/`` (the sandbox's ``FILE_NAME_PATTERN``) or a glob over
#: such names (``*``, ``?``, ``[...]``; matched with ``fnmatch.fnmatchcase``, so never a path).
FILE_GLOB_PATTERN = r"^[A-Za-z0-9_*?\[][A-Za-z0-9._*?\[\]!-]{0,127}$"
#: At most this many files declared in each direction (a contract feeds prompts and MCP schemas).
MAX_DECLARED_FILES = 32


class FileSpec(BaseModel):
    """One file a tool takes or produces: a name or a glob, what it holds (a media type), whether it must be
    there. A required output the program does not write is a contract violation (``runtime.agent.contracts``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=FILE_GLOB_PATTERN, description="a file name or a glob over names (chart-*.png)")
    media_type: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9.+-]{0,63}/[a-z0-9*][a-z0-9.+*-]{0,63}$", description="image/png, text/csv, ..."
    )
    description: str | None = Field(None, max_length=300)
    required: bool = Field(True, description="an input the caller must give; an output each ok run must write")


class ToolFiles(BaseModel):
    """The files of a tool's contract (issue 41): what its calls take as ``inputs/`` and write to ``outputs/``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    takes: list[FileSpec] = Field(default_factory=list, max_length=MAX_DECLARED_FILES)
    produces: list[FileSpec] = Field(default_factory=list, max_length=MAX_DECLARED_FILES)


class ToolContract(_Record):
    """What a tool is supposed to do: the arguments of ``delegate(role, purpose=..., ...)``.

    The one contract model: the agent stages and checks it (``runtime.agent.contracts``), the provider
    shows it to the model, the store keeps it. It holds the fields as given; what the store keeps and
    fingerprints is :meth:`bounded` (text over the bounds of ``runtime.names`` cut, as
    :class:`RegistryEntry` cuts it), so a contract staged in memory is enforced whole.
    """

    role: str
    purpose: str | None = None
    deliverable: JsonValue = None
    acceptance: JsonValue = None
    failure_policy: JsonValue = None
    #: typed inputs (issue 37): method name -> its positional parameters in order, each a JSON Schema with a
    #: ``name`` (``[{"name": "url", "type": "string", "description": "..."}]``); checked by
    #: ``runtime.agent.contracts.check_contract``. None: untyped (MCP clients get ``{args, kwargs}``)
    inputs: JsonValue = None
    #: the files its calls take and produce (issue 41); None: none declared
    files: ToolFiles | None = None

    def bounded(self) -> ToolContract:
        """The contract as the store keeps it: an over-long purpose or field cut (``self`` when none is)."""
        purpose = _clip_purpose(self.purpose)
        deliverable, acceptance, failure_policy = (
            _clip_json(v) for v in (self.deliverable, self.acceptance, self.failure_policy)
        )
        if (purpose, deliverable, acceptance, failure_policy) == (
            self.purpose, self.deliverable, self.acceptance, self.failure_policy
        ):  # fmt: skip
            return self
        return ToolContract(role=self.role, purpose=purpose, deliverable=deliverable, acceptance=acceptance,
                            failure_policy=failure_policy, inputs=self.inputs, files=self.files)  # fmt: skip

    def fingerprint(self) -> str:
        """The fingerprint of the contract as the store keeps it (:meth:`bounded`)."""
        c = self.bounded()
        files = c.files.model_dump(mode="json") if c.files is not None else None
        return contract_fingerprint(c.role, c.purpose, c.deliverable, c.acceptance, c.failure_policy, c.inputs, files)


def _bounded_contract(value: ToolContract | None) -> ToolContract | None:
    return value.bounded() if value is not None else None


class RegistryEntry(_Record):
    """One tool in ``registry.json`` (ADR 0012 section 3 plus bookkeeping for ranking and rebuilds)."""

    schema_version: Literal[2] = 2
    role: str
    purpose: Purpose = None
    deliverable: ContractField = None
    acceptance: ContractField = None
    failure_policy: ContractField = None
    #: the contract's typed inputs (see :class:`ToolContract`); None when untyped
    inputs: JsonValue = None
    #: the contract's files (see :class:`ToolContract`); None when it declares none
    files: ToolFiles | None = None
    contract_fingerprint: str | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    last_used_at: AwareDatetime | None = None
    usage_count: int = Field(0, ge=0)
    success_count: int = Field(0, ge=0)
    failure_count: int = Field(0, ge=0)
    intrinsic_failure_count: int = Field(0, ge=0)
    methods: list[str] = Field(default_factory=list)
    #: Union of the capability tags of the role's current *cacheable* artifacts ("a tool provides this").
    capabilities: list[str] = Field(default_factory=list)
    dir_name: str = ""

    @property
    def has_contract(self) -> bool:
        return self.purpose is not None

    def contract(self) -> ToolContract:
        return ToolContract(
            role=self.role,
            purpose=self.purpose,
            deliverable=self.deliverable,
            acceptance=self.acceptance,
            failure_policy=self.failure_policy,
            inputs=self.inputs,
            files=self.files,
        )


class RegistryFile(_Record):
    schema_version: Literal[2]  # no default on documents: a file without it is version 1
    tools: dict[str, RegistryEntry] = Field(default_factory=dict)


class RoleManifest(_Record):
    """``<role-dir>/manifest.json``: the role's contract and its methods (method name -> file name)."""

    schema_version: Literal[2]
    role: str
    contract: Annotated[ToolContract | None, AfterValidator(_bounded_contract)] = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    methods: dict[str, str] = Field(default_factory=dict)
    #: Per method: capability tags of its current artifact if that artifact may be reused, else [].
    capabilities: dict[str, list[str]] = Field(default_factory=dict)


class MethodArtifact(_Record):
    """One generation of one method: code plus metadata and health (ADR 0012 section 3, ADR 0013)."""

    schema_version: Literal[2] = 2
    role: str
    method_name: str
    generation: int = Field(ge=1)
    code: str
    dependencies: list[str] = Field(default_factory=list)
    #: the environment this generation runs with (issue 19; ADR 0012's ``dependencies``): the normalised
    #: manifest's spec with its resolved pins; rebuilt exactly on a machine that has not got it
    environment: EnvironmentSpec | None = None
    prompt_version: str | None = None
    runtime_version: str
    model: str | None = None
    code_checksum: str
    contract_fingerprint: str | None = None
    program_source: ProgramSource = ProgramSource.GENERATED
    capabilities: list[str] = Field(default_factory=list)
    #: None only for artifacts migrated from before ADR 0013 (legacy rule: see selection).
    cacheable: bool | None = None
    cacheability_reason: str | None = None
    input_sensitive: bool = False
    success_count: int = Field(0, ge=0)
    failure_count: int = Field(0, ge=0)
    intrinsic_failure_count: int = Field(0, ge=0)
    extrinsic_failure_count: int = Field(0, ge=0)
    adaptive_failure_count: int = Field(0, ge=0)
    #: Share of intrinsic failures among ``recent_outcomes`` (extrinsic/adaptive are not in the window).
    recent_failure_rate: float = Field(0.0, ge=0.0, le=1.0)
    #: Last HEALTH_WINDOW outcomes that say something about the code: True success, False intrinsic failure.
    recent_outcomes: list[bool] = Field(default_factory=list)
    consecutive_intrinsic_failures: int = Field(0, ge=0)
    #: Last ADAPTIVE_WINDOW answers: True an adaptive failure, False a success (intrinsic/extrinsic not here).
    recent_adaptive: list[bool] = Field(default_factory=list)
    last_failure_reason: str | None = None
    last_failure_class: FailureClass | None = None
    created_at: AwareDatetime
    last_used_at: AwareDatetime | None = None
    last_repaired_at: AwareDatetime | None = None
    last_regenerated_at: AwareDatetime | None = None
    repair_count_since_regen: int = Field(0, ge=0)

    def checksum_ok(self) -> bool:
        """True when the stored code still hashes to ``code_checksum`` (it was not edited or damaged)."""
        return code_checksum(self.code) == self.code_checksum


class MethodFile(_Record):
    """``<role-dir>/<method>.json``: the current artifact and up to RETAINED_PREVIOUS earlier ones.

    ``history`` is ordered most recently displaced first; ``next_generation`` never goes backwards, so a
    generation number names one artifact for good (rollback swaps artifacts, it does not renumber them).
    """

    schema_version: Literal[2]
    role: str
    method_name: str
    next_generation: int = Field(ge=2)
    current: MethodArtifact
    history: list[MethodArtifact] = Field(default_factory=list)

    def generations(self) -> list[MethodArtifact]:
        """Current first, then history."""
        return [self.current, *self.history]


class PatternEvent(_Record):
    """One generated or repaired call, as pattern memory remembers it (never its code)."""

    timestamp: AwareDatetime
    method_name: str
    capability_patterns: list[str] = Field(default_factory=list)
    outcome_status: Literal["ok", "error"] = "ok"
    error_type: str | None = None


class RolePatterns(_Record):
    """Events of one role, oldest first / NEWEST LAST, at most the store's window cap (default 50).

    ``window_counts`` is derived (label counts over the last 5 and 10 events, recomputed on every write)
    and only there for people reading the file; readers recompute from ``events``.
    """

    events: list[PatternEvent] = Field(default_factory=list)
    window_counts: dict[str, dict[str, int]] = Field(default_factory=dict)


class PatternsFile(_Record):
    schema_version: Literal[1]
    roles: dict[str, RolePatterns] = Field(default_factory=dict)
