"""What crosses the HTTP API: request bodies, responses, errors. The same shapes as the Python API and
``sandforge exec --json`` (an :class:`ExecResult` is ``exec --json``'s object; an agent call returns the
``Outcome`` model itself)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sandforge.runtime.files.transfer import manifest
from sandforge.sandbox import BACKENDS, ExecutionOutcome
from sandforge.sandbox.config import BackendName
from sandforge.sandbox.protocol import FileName, Files, SecurityEvent

__all__ = [
    "BACKENDS", "AgentCallRequest", "ErrorBody", "ErrorDetail", "ExecRequest", "ExecResult", "Health",
    "MessageRequest", "PolicyCheckRequest", "Readiness", "exec_result",
]  # fmt: skip

MAX_NAME = 128


class ExecRequest(BaseModel):
    """``POST /v1/exec``: one program validated by the tenant's policy and run in a fresh sandbox."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="a tool program: the body of a function with context, args, kwargs in scope")
    context: dict[str, JsonValue] = Field(default_factory=dict)
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    backend: BackendName | None = Field(None, description="default: the tenant's backend")
    timeout_s: float | None = Field(None, gt=0, le=3600, allow_inf_nan=False, description="at most the quota's")
    memory_mb: int | None = Field(None, ge=32, le=65536, description="at most the tenant's quota")
    files: Files = Field(
        default_factory=dict, description="input files by name, each base64: read-only to the program as inputs/NAME"
    )
    file_refs: dict[FileName, str] = Field(
        default_factory=dict,
        description="input files by name, each a stored file (POST /v1/files): its id or sandforge://files/ID",
    )


class OutputFile(BaseModel):
    """One file the program wrote to outputs/ (an ok run's only), inlined."""

    model_config = ConfigDict(extra="forbid")

    name: str
    size: int
    sha256: str
    media_type: str
    content_b64: str | None = Field(None, description="the bytes, inlined up to 64 KiB (or when not kept)")
    id: str | None = Field(None, description="the kept file's id (GET /v1/files/ID), None when not kept")
    url: str | None = Field(None, description="where to download it, under the tenant")


class ExecResult(BaseModel):
    """One execution's outcome: exactly the object ``sandforge exec --json`` prints."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "error"]
    value: JsonValue = None
    context: dict[str, JsonValue] | None = None
    error_type: str | None = None
    error_message: str | None = None
    retriable: bool = False
    stdout: str = ""
    stderr: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    security_event: SecurityEvent | None = Field(
        None, description="set when the run ended on a security event (a sandbox_violation; docs/security.md)"
    )
    files: list[OutputFile] = Field(default_factory=list, description="the outputs/ files of an ok run")


def exec_result(outcome: ExecutionOutcome) -> dict[str, Any]:
    """The stable JSON shape of an execution outcome: ``sandforge exec --json`` prints it, ``POST /v1/exec``
    answers it (``ExecResult`` is its schema)."""
    metadata = dict(outcome.metadata)
    metadata.update(
        duration_s=outcome.duration_s,
        usage=outcome.usage.model_dump(mode="json"),
        backend=outcome.backend,
        protections=outcome.protections,
        stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated,
    )
    return {
        "status": outcome.status,
        "value": outcome.value,
        "context": outcome.context,
        "error_type": outcome.error_type.value if outcome.error_type else None,
        "error_message": outcome.error_message,
        "retriable": outcome.retriable,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "metadata": metadata,
        "security_event": outcome.security_event.model_dump(mode="json") if outcome.security_event else None,
        "files": manifest(outcome.files, content=True),
    }


class AgentCallRequest(BaseModel):
    """``POST /v1/agents/{role}/{method}``: the call's arguments."""

    model_config = ConfigDict(extra="forbid")

    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


class PolicyCheckRequest(BaseModel):
    """``POST /v1/policy/check``: a program checked against the tenant's policy (nothing runs)."""

    model_config = ConfigDict(extra="forbid")

    code: str


class MessageRequest(BaseModel):
    """``POST /v1/sessions/{id}/messages``: one user turn."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=100_000)


class ErrorDetail(BaseModel):
    type: str = Field(description="a stable snake_case word: unauthorized, not_found, quota_exceeded, ...")
    message: str = Field(description="one line; never a traceback or a host path")


class ErrorBody(BaseModel):
    """Every non-2xx response of /v1."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "draining"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    backends: dict[str, str] = Field(default_factory=dict, description="backend -> 'ok' or why not")
