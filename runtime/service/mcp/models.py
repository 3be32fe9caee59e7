"""The MCP tools' structured results (their output schemas) and the typed error every failure carries."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolFailure(_Out):
    """Structured content of every ``isError`` result: the error type is the outcome's, never free text."""

    error_type: str = Field(description="snake_case type: timeout, guardrail_violation, tool_not_found, ...")
    error_message: str
    retriable: bool = False
    details: dict[str, Any] = Field(default_factory=dict, description="violations, suggestions, ...")


class Failed(Exception):
    """A typed failure of a tool: becomes an ``isError`` result. Here, not beside the tools' work
    (``operations``), so the server can catch it without importing that work before the handshake."""

    def __init__(self, failure: ToolFailure) -> None:
        super().__init__(f"{failure.error_type}: {failure.error_message}")
        self.failure = failure


def fail(error_type: str, message: str, *, retriable: bool = False, **details: Any) -> Failed:
    return Failed(ToolFailure(error_type=error_type, error_message=message, retriable=retriable, details=details))


class Violation(_Out):
    rule: str = Field(description="the rule or engine check that fired (explain_policy explains it)")
    classification: str
    message: str
    line: int | None = None
    fix: str | None = None


class ValidationReport(_Out):
    """The guardrail verdict of one program under the tenant's policy."""

    verdict: Literal["approved", "recoverable", "terminal"]
    violations: list[Violation]
    capabilities: list[str] = Field(description="capability tags the program uses")
    policy_fingerprint: str


class OutputFileInfo(_Out):
    """What the structured content says of one output file (its bytes are a content item)."""

    name: str
    size: int
    sha256: str
    media_type: str
    uri: str | None = Field(
        None, description="the kept file (sandforge://files/ID): a resource, and a file_refs value of a later run"
    )


class RunResult(_Out):
    """One validated execution that succeeded: its value, the new context (not committed anywhere), output."""

    status: Literal["ok"]
    value: JsonValue
    context: dict[str, JsonValue]
    stdout: str
    stderr: str
    backend: str
    duration_s: float
    capabilities: list[str]
    files: list[OutputFileInfo] = Field(
        default_factory=list, description="the outputs/ files, each also a content item (image or resource)"
    )
    #: The output files' bytes: content items beside the structured content, never inside it.
    _bytes: dict[str, bytes] = PrivateAttr(default_factory=dict)


class MethodSummary(_Out):
    method: str
    generation: int | None
    health: str | None = Field(description="healthy | degraded | unhealthy | unproven (None: no artifact)")
    reusable: bool | None = Field(description="cacheable and not a dynamic method: may run without the model")
    checksum_ok: bool | None
    status: str = Field(description="found | missing | corrupt")
    mcp_tool: str | None = Field(description="the MCP tool that calls this method directly, when it is one")


class ToolSummary(_Out):
    role: str
    purpose: str | None
    methods: list[str]
    usage_count: int
    success_count: int
    failure_count: int
    last_used_at: datetime | None


class ToolList(_Out):
    tools: list[ToolSummary]


class ToolDetail(_Out):
    role: str
    purpose: str | None
    deliverable: JsonValue
    acceptance: JsonValue
    failure_policy: JsonValue
    contract_fingerprint: str | None
    capabilities: list[str]
    methods: list[MethodSummary]
    code: str | None = Field(None, description="the current artifact's code, when one method was asked for")


class CallOutcome(_Out):
    """A dynamic call that succeeded, through the lifecycle (generate or reuse, validate, run, commit)."""

    status: Literal["ok"]
    value: JsonValue
    tool_role: str
    method_name: str
    program_source: str | None = Field(description="persisted (a stored artifact ran) or generated")
    files: list[OutputFileInfo] = Field(
        default_factory=list, description="the outputs/ files, each also a content item (image or resource)"
    )
    #: The output files' bytes: content items beside the structured content, never inside it.
    _bytes: dict[str, bytes] = PrivateAttr(default_factory=dict)


class PolicyPage(_Out):
    name: str
    page: str = Field(description="what the rule catches, why, and what to do instead (Markdown)")
