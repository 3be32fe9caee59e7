"""The wire protocol between the host and the in-sandbox runner, seen from the host.

Every message is one *frame*: a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.
Nothing else ever crosses the boundary (no pickle). The runner (the ``sandbox/inside/`` package) speaks the
same framing with the standard library only; its ``wire`` module holds what both sides must agree on (the
protocol version, header, bounds, error kinds, JSON encoding) and this module is the host's typed,
size-bounded view of it.

Host to runner:  ``boot`` (once, at spawn), ``execute`` (once), ``call_result`` (per nested call).
Runner to host:  ``ready`` (after lock-down), ``call`` (nested tool call), ``declare`` (a ``delegate(...)``
contract, answered like a call), ``fetch`` (a brokered request, answered by ``fetch_result`` and, for a
response, its body as one raw frame), ``result`` (exactly once).

The context travels per key (protocol 2): the ``execute`` frame lists the context's keys with the byte
length of each key's JSON text, and each text follows as a frame of its own; the ``result`` frame lists
only the keys the program changed (``context_changed``, their texts following as frames) or deleted
(``context_deleted``). So a 10 MB context is never escaped inside another JSON document, and state the
program did not touch is neither re-encoded nor sent back (see ``sandbox/context.py``). Where the channel
into the sandbox is a unix socket (protocol 3), the largest keys' texts are not sent at all: each is a
sealed memfd attached to the ``execute`` frame, which the runner checks and maps read-only. Containers run
by dockerd get them as files in a read-only hand-off directory instead (``sandbox/handoff.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from sandforge.sandbox.context import ContextSnapshot, may_hold_non_finite
from sandforge.sandbox.files import read_input
from sandforge.sandbox.inside import wire
from sandforge.sandbox.inside.wire import HEADER as HEADER
from sandforge.sandbox.inside.wire import MAX_CONTRACT_FIELD_CHARS as MAX_CONTRACT_FIELD_CHARS
from sandforge.sandbox.inside.wire import MAX_ERROR_MESSAGE as MAX_ERROR_MESSAGE
from sandforge.sandbox.inside.wire import MAX_FRAME_DEPTH as MAX_FRAME_DEPTH
from sandforge.sandbox.inside.wire import MAX_NAME as MAX_NAME
from sandforge.sandbox.inside.wire import MAX_PURPOSE_CHARS as MAX_PURPOSE_CHARS
from sandforge.sandbox.inside.wire import MAX_VALUE_DEPTH as MAX_VALUE_DEPTH
from sandforge.sandbox.inside.wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from sandforge.sandbox.inside.wire import ErrorKind


class ProtocolError(Exception):
    """A frame was malformed, oversized or out of order: the sandbox is not trusted to continue."""


class FrameTooLarge(ProtocolError):
    """A frame would exceed its size limit (the one ``ProtocolError`` a sender can answer with a smaller one)."""


class ErrorType(StrEnum):
    """Typed failure classes of one execution. ``retriable`` is derived from the type (see RETRIABLE)."""

    TIMEOUT = ErrorKind.TIMEOUT
    MEMORY_LIMIT = ErrorKind.MEMORY_LIMIT
    OUTPUT_LIMIT = ErrorKind.OUTPUT_LIMIT
    EXECUTION = ErrorKind.EXECUTION
    INVALID_CODE = ErrorKind.INVALID_CODE
    NON_SERIALIZABLE_RESULT = ErrorKind.NON_SERIALIZABLE_RESULT
    SANDBOX_VIOLATION = ErrorKind.SANDBOX_VIOLATION
    SANDBOX_UNAVAILABLE = ErrorKind.SANDBOX_UNAVAILABLE
    INVALID_REQUEST = ErrorKind.INVALID_REQUEST
    TOOL_ERROR = ErrorKind.TOOL_ERROR  # the program returned Outcome.error(...) itself
    GUARDRAIL_VIOLATION = ErrorKind.GUARDRAIL_VIOLATION  # rejected by the host's policy; nothing was executed
    INVALID_CONTRACT = ErrorKind.INVALID_CONTRACT  # delegate(...) got a contract field that is not JSON
    EGRESS_DENIED = ErrorKind.EGRESS_DENIED  # the egress policy does not allow a request: terminal
    EGRESS_LIMIT = ErrorKind.EGRESS_LIMIT  # an egress budget was exceeded: the program's fault
    NETWORK_ERROR = ErrorKind.NETWORK_ERROR  # DNS, connection, TLS, timeout of a brokered request: extrinsic
    MISSING_CREDENTIALS = ErrorKind.MISSING_CREDENTIALS  # the policy injects a credential the host lacks
    INVALID_FETCH = ErrorKind.INVALID_FETCH  # a malformed request (not a URL, bad method, ...)
    # the program's environment could not be prepared on the host (issue 19, docs/environments.md); nothing ran
    INVALID_DEPENDENCY_MANIFEST = ErrorKind.INVALID_DEPENDENCY_MANIFEST  # malformed PEP 723 block: recoverable
    DEPENDENCY_POLICY_VIOLATION = ErrorKind.DEPENDENCY_POLICY_VIOLATION  # not allowed (declared/transitive)
    DEPENDENCY_RESOLUTION_FAILED = ErrorKind.DEPENDENCY_RESOLUTION_FAILED  # no versions satisfy it: intrinsic
    DEPENDENCY_INSTALL_FAILED = ErrorKind.DEPENDENCY_INSTALL_FAILED  # a download, the disk, uv: extrinsic
    ENVIRONMENT_PREPARING = ErrorKind.ENVIRONMENT_PREPARING  # another process still building it: extrinsic


#: Extrinsic failures: the same program may succeed when retried later (engine back up, less load).
RETRIABLE: frozenset[ErrorType] = frozenset({
    ErrorType.SANDBOX_UNAVAILABLE, ErrorType.TIMEOUT, ErrorType.NETWORK_ERROR, ErrorType.DEPENDENCY_INSTALL_FAILED,
    ErrorType.ENVIRONMENT_PREPARING,
})  # fmt: skip


#: The most one file may hold (``Limits.max_file_bytes``' ceiling): how much of a path is read at most.
MAX_FILE_BYTES = 512 << 20


class Limits(BaseModel):
    """Resource limits of one execution; every backend enforces all of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(default=5.0, gt=0, le=3600, allow_inf_nan=False, description="wall-clock limit")
    memory_mb: int = Field(default=256, ge=32, le=65536, description="address space / container memory, no swap")
    cpu_s: int | None = Field(default=None, ge=1, le=3600, description="CPU seconds; default timeout + 1")
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024, description="stdout and stderr each")
    max_message_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024, le=512 * 1024 * 1024)
    disk_mb: int = Field(default=16, ge=1, le=4096, description="private writable scratch space")
    max_processes: int = Field(default=16, ge=1, le=4096, description="container pids limit")
    max_open_files: int = Field(default=64, ge=16, le=65536)
    cpus: float = Field(default=1.0, gt=0, le=64, allow_inf_nan=False, description="container CPU quota")
    max_files: int = Field(default=64, ge=0, le=4096, description="input files, and output files, each at most")
    max_file_bytes: int = Field(default=8 << 20, ge=0, le=MAX_FILE_BYTES, description="one input or output file")
    max_files_bytes: int = Field(
        default=16 << 20, ge=0, le=MAX_FILE_BYTES, description="the input files in all, and the output files in all"
    )

    @property
    def effective_cpu_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 1


JsonDict = dict[str, JsonValue]


def _context_dict(snapshot: ContextSnapshot) -> dict[str, Any]:
    return ContextSnapshot.coerce(snapshot).to_dict()


#: A context as requests hold it: a ContextSnapshot. A dict is encoded into one key by key (json.dumps in C
#: is the check; pydantic's JsonValue walk is far slower: docs/benchmarks.md, "Numbers behind the code"); a
#: non-JSON value is a validation error.
#: Dumped and described in JSON schema as the JSON object it is.
Context = Annotated[
    ContextSnapshot,
    PlainValidator(ContextSnapshot.coerce, json_schema_input_type=JsonDict),
    PlainSerializer(_context_dict, return_type=JsonDict),
]


#: Where a ready environment is mounted read-only in every sandbox (``runtime/environments``' MOUNT_PATH).
ENV_MOUNT_PATH: str = wire.ENV_MOUNT_PATH


#: A top-level module a program may be given: public (``_yaml``, a package's private extension, is importable
#: by the package itself but never exposed to the program) and short.
EXPOSABLE_MODULE = r"^[A-Za-z][A-Za-z0-9_]{0,99}$"


class EnvironmentMount(BaseModel):
    """A ready environment (built by ``runtime/environments``) for the sandbox to mount read-only at
    ``ENV_MOUNT_PATH``: its id, the host path of its ``site`` directory and the top-level modules the program
    may import. The sandbox checks it against the environment's own record before mounting anything
    (``sandbox/environment.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the environment's id (its directory's name)")
    site: str = Field(min_length=1, max_length=4096, description="absolute host path of the environment's site/")
    modules: tuple[Annotated[str, Field(pattern=EXPOSABLE_MODULE)], ...] = Field(
        default=(), max_length=512, description="top-level modules exposed to the program (a subset of what the "
        "environment provides)",
    )  # fmt: skip

    @field_validator("modules")
    @classmethod
    def _sorted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(value)))


def _file_bytes(value: Any) -> Any:
    """A file's bytes: as given in Python, or read from a ``pathlib.Path`` (``sandbox/files.py``'s rules),
    base64 text in JSON (strict: what a dump produced)."""
    if isinstance(value, os.PathLike):
        return read_input(value, MAX_FILE_BYTES)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("a file's content in JSON is base64 text") from None
    return value


#: One file's bytes: ``bytes`` in Python, base64 text in JSON (a request or outcome crossing processes).
FileBytes = Annotated[
    bytes, BeforeValidator(_file_bytes), PlainSerializer(lambda b: base64.b64encode(b).decode(), when_used="json")
]
#: A file's name in ``inputs/`` or ``outputs/``: one path segment, no leading dot (so never ``..``), a safe
#: charset (``wire.FILE_NAME_PATTERN``; the inside checks the same pattern).
FileName = Annotated[str, Field(pattern=f"^{wire.FILE_NAME_PATTERN}$")]
#: Files by name, as a request carries its inputs and an outcome its outputs.
Files = dict[FileName, FileBytes]


class ExecutionRequest(BaseModel):
    """A tool program plus the JSON snapshot it runs against (the program contract)."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="body of a function with `context`, `args` and `kwargs` in scope")
    context: Context = Field(default_factory=ContextSnapshot)
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: JsonDict = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    wall_budget_s: float | None = Field(
        default=None, gt=0, le=3600,
        description="host-side only: end the execution after at most this many seconds, when less than "
        "limits.timeout_s (a nested call's share of its caller's remaining time); time spent serving the "
        "program's own nested calls counts against it",
    )  # fmt: skip
    environment: EnvironmentMount | None = Field(
        default=None, description="a ready environment mounted read-only into the sandbox (None: standard library only)"
    )
    files: Files = Field(
        default_factory=dict,
        description="input files, read-only to the program as inputs/NAME: bytes, or a pathlib.Path read now "
        "(a regular file, not a symlink); bounded by limits' max_files, max_file_bytes and max_files_bytes, "
        "and by the sandbox's disk_mb",
    )
    #: ``sandforge doctor``'s canary: the runner makes a forbidden event from a program-like frame after arming
    #: its tripwire and must be stopped. A private attribute: no JSON, program, context value or tool contract
    #: sets it (``tripwire_canary()`` does, on the host).
    _tripwire_canary: bool = PrivateAttr(default=False)

    if TYPE_CHECKING:  # what a caller may pass, for type checkers without pydantic's plugin (it is validated)

        def __init__(
            self, *, code: str, context: ContextSnapshot | Mapping[str, Any] = ..., args: Sequence[Any] = ...,
            kwargs: Mapping[str, Any] = ..., limits: Limits = ..., wall_budget_s: float | None = ...,
            environment: EnvironmentMount | None = ..., files: Mapping[str, bytes | str | os.PathLike[str]] = ...,
        ) -> None: ...  # fmt: skip

    @model_validator(mode="after")
    def _bounded_files(self) -> ExecutionRequest:
        limits, sizes = self.limits, [len(body) for body in self.files.values()]
        if len(sizes) > limits.max_files:
            raise ValueError(f"{len(sizes)} input files; the limit is {limits.max_files} (limits.max_files)")
        for name, body in self.files.items():
            if len(body) > limits.max_file_bytes:
                raise ValueError(f"input file {name!r} is {len(body)} bytes; the limit is {limits.max_file_bytes}"
                                 " (limits.max_file_bytes)")  # fmt: skip
        if sum(sizes) > limits.max_files_bytes:
            raise ValueError(f"the input files are {sum(sizes)} bytes; the limit is {limits.max_files_bytes}"
                             " (limits.max_files_bytes)")  # fmt: skip
        if sum(sizes) > (limits.disk_mb << 20) * 3 // 4:
            raise ValueError(f"the input files ({sum(sizes)} bytes) leave too little of the sandbox's "
                             f"{limits.disk_mb} MB disk (limits.disk_mb)")  # fmt: skip
        return self


def tripwire_canary() -> ExecutionRequest:
    """The canary request of ``sandforge doctor``: it must end as ``sandbox_violation`` with the tripwire's
    security event ``sys._getframe`` (the runner's tripwire stopped a forbidden event from a program frame)."""
    request = ExecutionRequest(code="return 'the canary was not stopped'")
    request._tripwire_canary = True
    return request


class SecurityEvent(BaseModel):
    """Something a program confined to its proxies could never cause (docs/security.md, "The tripwire").

    ``source`` says which layer saw it: ``tripwire`` (the runner's PEP 578 audit hook: ``event`` is the
    audit event's name, such as ``open`` or ``compile``), ``inner_wall`` (a withheld name, rewritten globals:
    ``event`` names the check) or ``host`` (the host's own observation of the channel: a forged or second
    result, an ok result with an unclean exit). ``detail`` is a short description that never carries the
    event's arguments (paths, source text, secrets).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["tripwire", "inner_wall", "host"]
    event: str = Field(min_length=1, max_length=MAX_NAME)
    detail: str = Field("", max_length=1000)


class ResourceUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_time_s: float = 0.0
    peak_memory_mb: float = 0.0
    source: Literal["host", "sandbox"] = Field(
        default="host", description="'host': measured outside the sandbox; 'sandbox': reported by the runner"
    )


class ExecutionOutcome(BaseModel):
    """What one execution produced. ``context`` is present only when ``status`` is ok.

    An outcome from a sandbox holds the new context as a snapshot (the ``context_snapshot`` field) and
    decodes it into ``context`` only when that is first read (or the outcome is dumped): a caller that
    chains executions passes the snapshot on and never decodes the keys it does not look at. An outcome
    built with a ``context`` dict gets its snapshot from it; assigning ``context`` replaces both.
    """

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "error"]
    value: JsonValue = None
    context: JsonDict | None = None
    error_type: ErrorType | None = None
    error_message: str | None = None
    retriable: bool = False
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    usage: ResourceUsage = Field(default_factory=ResourceUsage)
    backend: str = ""
    protections: dict[str, bool] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    security_event: SecurityEvent | None = Field(
        default=None, description="set when the execution ended on a security event (always a sandbox_violation)"
    )
    files: Files = Field(
        default_factory=dict,
        exclude=True,
        repr=False,
        description="the output files of an ok execution (outputs/NAME), checked against the request's limits; "
        "empty for any other; not dumped (callers commit or list them: they are bytes)",
    )
    context_snapshot: Context | None = Field(
        default=None, exclude=True, repr=False,
        description="the new context as each key's JSON text (None for an error outcome): what a caller "
        "chains on without decoding; not dumped (``context`` is)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_context(self) -> ExecutionOutcome:
        given = self.model_fields_set
        if "context" in given and "context_snapshot" in given:
            raise ValueError("give an outcome's context or its context_snapshot, not both")
        if "context_snapshot" in given:
            if self.context_snapshot is not None:
                del self.__dict__["context"]  # absent until read: decoded from the snapshot, see __getattr__
        elif self.context is not None:
            self.__dict__["context_snapshot"] = ContextSnapshot.from_dict(self.context)
        return self

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def succeeded(cls, value: JsonValue, snapshot: ContextSnapshot, **fields: Any) -> ExecutionOutcome:
        """An ok outcome whose ``context`` is decoded from ``snapshot`` on first access."""
        return cls(status="ok", value=value, context_snapshot=snapshot, **fields)

    def _materialize_context(self) -> JsonDict | None:
        if "context" not in self.__dict__:
            snapshot = self.context_snapshot
            self.__dict__["context"] = None if snapshot is None else snapshot.to_dict()
        context: JsonDict | None = self.__dict__["context"]
        return context

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            if name == "context":
                return self._materialize_context()
            return super().__getattr__(name)

        def __setattr__(self, name: str, value: Any) -> None:
            if name == "context":  # an assigned context replaces the one the execution produced
                snapshot = None if value is None else ContextSnapshot.from_dict(value)
                super().__setattr__("context_snapshot", snapshot)
            super().__setattr__(name, value)

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._materialize_context()
        return super().model_dump(*args, **kwargs)

    def model_dump_json(self, *args: Any, **kwargs: Any) -> str:
        self._materialize_context()
        return super().model_dump_json(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExecutionOutcome):
            self._materialize_context()
            other._materialize_context()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def failure(
        cls, error_type: ErrorType, message: str, *, retriable: bool | None = None, **fields: Any
    ) -> ExecutionOutcome:
        return cls(
            status="error",
            error_type=error_type,
            error_message=message,
            retriable=(error_type in RETRIABLE) if retriable is None else retriable,
            **fields,
        )


# --- frames -------------------------------------------------------------------------------------------


class BootEnvironment(BaseModel):
    """What a runner needs of its environment: the id (checked against each execute frame's), the modules
    to expose and, for a runner that builds its own private root (subprocess), the host directory to bind
    read-only at ``ENV_MOUNT_PATH``; a container's runtime mounts it instead (``bind_source`` None)."""

    env_id: str
    modules: list[str]
    bind_source: str | None = None


class BootSeam(BaseModel):
    """The tests' and the benchmark's seam (``sandbox/seam.py``): never set in production."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tripwire_off: bool = Field(False, description="start the runner without its audit hook (benchmark, tests)")
    unwrapped: tuple[str, ...] = Field(
        (),
        description="``module.name`` whose real callable replaces the runner's wrapper on the proxy, or one of the "
        "runner's own layers reverted (``generators.check_generated_names``, ``packages.*``: serving._REVERTIBLE)",
    )


class BootFrame(BaseModel):
    """Sent once at spawn: how the runner locks itself down before it may receive code."""

    type: Literal["boot"] = "boot"
    version: int = PROTOCOL_VERSION
    sys_path: list[str] = Field(default_factory=list, description="where RestrictedPython lives")
    limits: Limits
    seccomp_bpf_b64: str | None = None
    namespaces: bool = False
    chroot: bool = False
    workdir: str | None = None
    drop_to_uid: int | None = None
    drop_to_gid: int | None = None
    handoff_dir: str | None = Field(default=None, description="a read-only directory of handed-off context values")
    handoff_token: str | None = Field(default=None, description="what the runner must find in handoff_dir/token")
    environment: BootEnvironment | None = Field(default=None, description="the environment this sandbox serves")
    seam: BootSeam | None = Field(default=None, description="tests and benchmark only (sandbox/seam.py)")


# The execute frame is ``wire.ExecuteFrame`` (a TypedDict the host builds and the inside reads): the request
# it carries is validated already, and re-validating it through a model cost measurable CPU for large
# arguments.


class BridgeReply(BaseModel):
    """The host's answer to one nested ``call`` or ``declare`` frame: what ``tool(...)``/``delegate(...)``
    returns inside the sandbox (the runner reads exactly these fields)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["ok", "error"]
    value: JsonValue = None
    error_type: str | None = None
    error_message: str | None = None
    retriable: bool = False
    #: a ``call_with_files`` callee's committed outputs (name -> base64), written into the caller's ``outputs/``
    files: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def error(cls, error_type: str, message: str, *, retriable: bool = False) -> BridgeReply:
        return cls(status="error", error_type=error_type, error_message=message, retriable=retriable)

    @classmethod
    def of(cls, reply: BridgeReply | Mapping[str, Any]) -> BridgeReply:
        """A handler's answer as a reply. A mapping's envelope (status, error fields) is validated; its
        ``value`` is checked as JSON when the reply is encoded (``encode_frame``, C speed), not walked here."""
        if isinstance(reply, BridgeReply):
            return reply
        envelope = cls.model_validate({k: v for k, v in reply.items() if k != "value"})
        return envelope.model_copy(update={"value": reply.get("value")}) if "value" in reply else envelope

    def wire(self) -> dict[str, Any]:
        """The fields as plain data: the value as the handler gave it, so that encoding it is its JSON check."""
        wire: dict[str, Any] = {"status": self.status, "value": self.value, "error_type": self.error_type,
                                "error_message": self.error_message, "retriable": self.retriable}  # fmt: skip
        if self.files:
            wire["files"] = self.files
        return wire


class CallResultFrame(BaseModel):
    type: Literal["call_result"] = "call_result"
    id: int
    outcome: BridgeReply

    def wire(self) -> dict[str, Any]:
        """The frame for ``encode_frame`` as plain data (see ``BridgeReply.wire``), not a pydantic dump."""
        return {"type": self.type, "id": self.id, "outcome": self.outcome.wire()}


class ReadyFrame(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["ready"]
    version: int
    pid: int
    protections: dict[str, bool]
    errors: list[str] = Field(default_factory=list)
    handoff: bool = Field(default=False, description="the runner sees the boot frame's handoff_dir")
    environment: Literal["read_only", "missing", "writable"] | None = Field(
        default=None, description="how the runner sees its environment's mount (None: it has none)"
    )


# ``MAX_PURPOSE_CHARS`` and ``MAX_CONTRACT_FIELD_CHARS`` (from ``wire``): the runner refuses longer contract
# fields itself (``invalid_contract``), so only a misbehaving runner sends one.


def _bounded_contract_field(value: JsonValue) -> JsonValue:
    if value is not None and len(json.dumps(value, ensure_ascii=False)) > MAX_CONTRACT_FIELD_CHARS:
        raise ValueError(f"contract field longer than {MAX_CONTRACT_FIELD_CHARS} characters of JSON")
    return value


ContractField = Annotated[JsonValue, AfterValidator(_bounded_contract_field)]


class CallTarget(BaseModel):
    """Who a nested call goes to. A ``delegate`` target carries its contract: ``purpose`` is text, the
    other fields are any JSON values (a deliverable is typically a JSON Schema object)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tool", "delegate"]
    name: str = Field(max_length=200)
    purpose: str | None = Field(None, max_length=MAX_PURPOSE_CHARS)
    deliverable: ContractField = None
    acceptance: ContractField = None
    failure_policy: ContractField = None
    #: the files its calls take and produce (``ToolFiles``' fields: ``takes``, ``produces``), checked by the host
    files: ContractField = None


class DeclareFrame(BaseModel):
    """``delegate(role, ...)`` ran: stage the role's contract with this attempt (answered by a
    ``call_result``), whether or not the program then calls the tool."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["declare"]
    id: int = Field(ge=0)
    target: CallTarget


class CallFrame(BaseModel):
    """A nested dynamic call made by the program through ``tool(...)`` or ``delegate(...)``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["call"]
    id: int = Field(ge=0)
    target: CallTarget
    method: str = Field(max_length=200)
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: JsonDict = Field(default_factory=dict)
    #: ``handle.call_with_files``: the files handed to the callee (name -> base64), read by the runner from its
    #: own ``inputs/``/``outputs/`` (``inside/handing.py``); checked by the host against the run's limits
    files: dict[FileName, str] = Field(default_factory=dict)


class FetchFrame(BaseModel):
    """A brokered request made by the program through ``fetch()`` or a stand-in (``urllib``/``requests``):
    ``request`` holds the fields of ``runtime/egress/wire.py``'s ``FetchRequest``, judged by the broker."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["fetch"]
    id: int = Field(ge=0)
    request: JsonDict
    #: The previous fetch's ``fetch_result`` receipt, echoed (none on the first fetch): proof that the runner
    #: read that reply, on every channel (Docker's attach socket cannot count unread bytes).
    receipt: str | None = Field(None, max_length=64)


FETCH_ERROR_KINDS: frozenset[str] = wire.FETCH_ERROR_KINDS


class FetchFailureWire(BaseModel):
    """A broker's refusal or failure, as the program gets it (raised as the ``FetchError`` of ``kind``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["egress_denied", "egress_limit", "network_error", "missing_credentials", "invalid_fetch"]
    message: str = Field(max_length=MAX_ERROR_MESSAGE)
    reason: str = Field("", max_length=100)


class FetchResponseWire(BaseModel):
    """A broker's response: what the ``fetch_result`` frame says of it (the body travels as its own frame)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: int = Field(ge=100, le=999)
    headers: dict[str, str]
    url: str
    body_b64: str = ""
    elapsed_ms: float = Field(0.0, ge=0, allow_inf_nan=False)


class FetchReplyWire(BaseModel):
    """An egress handler's answer (``runtime/egress/wire.py``'s ``FetchReply``): exactly one of the two."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    response: FetchResponseWire | None = None
    error: FetchFailureWire | None = None

    @model_validator(mode="after")
    def _one(self) -> FetchReplyWire:
        if (self.response is None) == (self.error is None):
            raise ValueError("a fetch reply carries exactly one of response and error")
        return self

    @classmethod
    def failure(cls, kind: str, message: str, reason: str) -> FetchReplyWire:
        return cls.model_validate({"error": {"kind": kind, "message": message[:MAX_ERROR_MESSAGE], "reason": reason}})

    def header(self, fetch_id: int, body_bytes: int) -> dict[str, Any]:
        """The ``fetch_result`` frame: the error, or the response without its body (``body_bytes`` of it
        follow as one raw frame)."""
        if self.error is not None:
            return {"type": "fetch_result", "id": fetch_id, "error": self.error.model_dump()}
        assert self.response is not None
        response = self.response.model_dump(exclude={"body_b64"})
        return {"type": "fetch_result", "id": fetch_id, "response": {**response, "body_bytes": body_bytes}}


#: The error types a runner may report. The others are the host's own observations (``timeout``,
#: ``sandbox_unavailable``, ``guardrail_violation``): a result frame claiming one is forged.
RUNNER_ERROR_TYPES: frozenset[ErrorType] = frozenset(ErrorType(kind) for kind in wire.INSIDE_ERROR_KINDS)
#: Bounds of a result frame's fields, as the runner produces them: ``MAX_ERROR_MESSAGE`` and ``MAX_NAME``
#: (``wire``), and this one.
MAX_STDOUT_BYTES = 16 * 1024 * 1024  # the largest ``Limits.max_output_bytes``; a request's own is checked too
# A frame nests at most ``MAX_FRAME_DEPTH`` deep (jiter's limit): a value inside a frame at most one level
# less (``MAX_VALUE_DEPTH``); both from ``wire``.
_Usage = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


class RunnerError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: ErrorType
    message: str = Field(max_length=MAX_ERROR_MESSAGE)
    exception: str | None = Field(None, max_length=MAX_NAME)
    line: int | None = Field(None, ge=0, le=1 << 31)
    retriable: bool | None = None
    tool_error_type: str | None = Field(None, max_length=MAX_NAME)
    security_event: SecurityEvent | None = None

    @field_validator("type")
    @classmethod
    def _runner_may_send(cls, value: ErrorType) -> ErrorType:
        if value not in RUNNER_ERROR_TYPES:
            raise ValueError(f"error type {value.value!r} is the host's to report, not the runner's")
        return value


class ResultFrame(BaseModel):
    """The one result; a frame per ``context_changed`` key (its new JSON text) follows it, in order."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["result"]
    status: Literal["ok", "error"]
    value: JsonValue = None
    context_changed: list[tuple[Annotated[str, Field(max_length=1 << 20)], Annotated[int, Field(ge=0)]]] = Field(
        default_factory=list
    )
    context_deleted: list[str] = Field(default_factory=list)
    #: The output files, ``[name, length]``: each one's bytes follow the changed keys' texts as a frame.
    files: list[tuple[FileName, Annotated[int, Field(ge=0)]]] = Field(default_factory=list)
    #: The output files among ``files`` whose bytes are not frames but the descriptors attached to this frame,
    #: in that order (a result channel that passes descriptors: ``sandbox/files.py``, ``read_passed_output``).
    files_passed: list[FileName] = Field(default_factory=list, max_length=wire.MAX_PASSED_FDS)
    error: RunnerError | None = None
    stdout: str = Field("", max_length=MAX_STDOUT_BYTES)
    stderr: str = Field("", max_length=MAX_STDOUT_BYTES)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_time_s: _Usage = 0.0
    peak_memory_mb: _Usage = 0.0


RunnerFrame = Annotated[ReadyFrame | CallFrame | DeclareFrame | FetchFrame | ResultFrame, Field(discriminator="type")]
_RUNNER_FRAME: TypeAdapter[ReadyFrame | CallFrame | DeclareFrame | FetchFrame | ResultFrame] = TypeAdapter(RunnerFrame)


def encode_frame(frame: BaseModel | Mapping[str, Any], max_bytes: int) -> bytes:
    """Serialize one frame; refuses NaN/Infinity (not JSON) and anything over ``max_bytes``."""
    payload = frame.model_dump(mode="json") if isinstance(frame, BaseModel) else frame
    try:
        body = wire.dumps(payload).encode()
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"frame is not JSON-serializable: {exc}") from exc
    if len(body) > max_bytes:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    return HEADER.pack(len(body)) + body


def decode_runner_frame(body: bytes) -> ReadyFrame | CallFrame | DeclareFrame | FetchFrame | ResultFrame:
    """Validate one frame that came out of the sandbox. Anything unexpected is a ProtocolError.

    Strict JSON only: jiter refuses ``NaN``/``Infinity`` tokens here and bounds the depth, but turns an
    overflowing literal (``1e400``) into ``inf``; ``ensure_finite`` refuses that afterwards."""
    try:
        frame = _RUNNER_FRAME.validate_json(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        at = f" (at {where})" if where else ""
        raise ProtocolError(f"malformed frame from sandbox: {error['msg']}{at}") from exc
    if isinstance(frame, ReadyFrame) or (isinstance(frame, ResultFrame) and _scalar(frame.value)):
        return frame  # its other numbers are fields pydantic checks (finite, bounded)
    if not may_hold_non_finite(body):
        return frame
    if isinstance(frame, ResultFrame):
        ensure_finite(frame.value, "the result value")
        return frame
    if isinstance(frame, FetchFrame):
        ensure_finite(frame.request, "a fetch request")
        return frame
    if isinstance(frame, CallFrame):
        ensure_finite(frame.args, "a nested call's arguments")
        ensure_finite(frame.kwargs, "a nested call's arguments")
    target = frame.target
    ensure_finite([target.deliverable, target.acceptance, target.failure_policy], "a delegate contract")
    return frame


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value))


def ensure_finite(value: Any, what: str) -> None:
    """ProtocolError if ``value`` holds a non-finite float (what an overflowing literal such as ``1e400``
    parses to). Checked by ``json.dumps`` in C, which refuses them with ``allow_nan=False``."""
    if value is None or isinstance(value, (str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(f"{what} holds a non-finite number")
        return
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False, check_circular=False)
    except ValueError:
        raise ProtocolError(f"{what} holds a non-finite number") from None


class FrameReader:
    """Incremental decoder: feed bytes as they arrive, take complete frame bodies out.

    A frame whose body spans several chunks (an output file: 1 MiB per read) gathers them as they came and
    joins them once: one copy of its bytes here, not an append and a copy out."""

    def __init__(self, max_bytes: int) -> None:
        self._buf = bytearray()
        self._max = max_bytes
        #: The body being gathered (its chunks, and how many bytes it still needs); None between frames.
        self._parts: list[bytes] | None = None
        self._left = 0

    def feed(self, data: bytes) -> list[bytes]:
        frames: list[bytes] = []
        if self._parts is not None:
            if len(data) < self._left:
                self._parts.append(data)
                self._left -= len(data)
                return frames
            self._parts.append(data[: self._left])
            frames.append(b"".join(self._parts))
            data, self._parts = data[self._left :], None
        self._buf += data
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self._max:
                raise ProtocolError(f"sandbox announced a {size}-byte frame (limit {self._max})")
            if len(self._buf) < HEADER.size + size:
                if size >= 1 << 20:  # gather the rest as it comes
                    self._parts, self._left = [bytes(self._buf[HEADER.size :])], HEADER.size + size - len(self._buf)
                    self._buf.clear()
                break
            with memoryview(self._buf) as view:  # one copy of a large frame, not two
                frames.append(bytes(view[HEADER.size : HEADER.size + size]))
            del self._buf[: HEADER.size + size]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame (its header included) held so far."""
        gathered = HEADER.size + sum(len(part) for part in self._parts) if self._parts is not None else 0
        return len(self._buf) + gathered
