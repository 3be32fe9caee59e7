"""The call log: one JSON line per logical call (nested calls too), schema in docs/schemas/.

A record carries the call's identity, the program that ran and where it came from, the outcome, every
ADR 0016 lifecycle field (sections 6 and 7: attempt stage, lane counters, exhaustion flags,
``latest_failure_*``, ``attempt_failures[]``), the validation verdict (capabilities, policy fingerprint),
what the sandbox measured and, when a ToolStore serves the workspace, what the store saw and did (ADR 0012
section 10, ADR 0013, pattern-memory plan phase 4). Every free-text field is bounded.

Records of nested calls are staged with the attempt of their parent and written only when that attempt
commits; a rolled-back attempt keeps a summary of them in its ``attempt_failures`` entry instead.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import threading
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from sandforge.runtime.agent.trace_budget import TraceUsage
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store.logfields import STORE_LOG_FIELDS, ProgramSourceField, StoreLogFields
from sandforge.sandbox.protocol import SecurityEvent

if TYPE_CHECKING:
    from sandforge.runtime.guardrails import Capability as FoundCapability

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
LOG_ENV = "SANDFORGE_CALL_LOG"
MAX_MESSAGE_CHARS = 500
MAX_CODE_CHARS = 20_000
MAX_JSON_CHARS = 2_000
MAX_STDOUT_CHARS = 2_000
#: Provenance records kept per attempt (``egress_requests`` still counts them all); URLs cut at 2 000 characters.
MAX_EGRESS_RECORDS = 100
MAX_URL_CHARS = 2_000
#: The URLs (redirects included) one attempt's records keep in all: 100 records of 30 hops of 2 000 characters
#: would be 6 MB, and a run's record holds its attempt's twice, past the 4 MiB a reader of the log takes.
MAX_EGRESS_URL_CHARS = 256_000

AttemptStage = Literal["generated", "validated", "executed", "rolled_back"]
FailureStage = Literal["generation", "validation", "execution", "outcome_policy"]
#: Who asked for the call: ``agent`` (a tool call through the lifecycle: the library, ``POST /v1/agents``,
#: sessions, MCP stored tools) or a run of a program the caller handed in (``runtime.agent.runs``):
#: ``cli`` (``sandforge exec``), ``http`` (``POST /v1/exec``), ``mcp`` (``run_tool_code``).
CallSource = Literal["agent", "cli", "http", "mcp", "framework"]


def bounded(text: str | None, limit: int = MAX_MESSAGE_CHARS) -> str | None:
    """``text`` cut to ``limit`` characters (with a marker), None stays None."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 15] + "...[truncated]"


def bounded_json(value: Any, limit: int = MAX_JSON_CHARS) -> JsonValue:
    """``value`` itself when its JSON is short, else ``{"truncated": true, "preview": <first chars>}``."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return json.loads(text)  # type: ignore[no-any-return]
    return {"truncated": True, "chars": len(text), "preview": text[:limit]}


class CallSecurityEvent(SecurityEvent):
    """A security event as the call log keeps it: the sandbox's :class:`SecurityEvent` (source, event, detail)
    and where it happened (the attempt, the tool), so a query of the log finds every one and its call."""

    attempt_id: str = Field(description="'<call_id>.<attempt number>' of the attempt whose execution ended on it")
    attempt_number: int = Field(ge=1)
    role: str
    method: str
    timestamp: AwareDatetime

    @classmethod
    def of(cls, event: SecurityEvent, *, attempt_id: str, attempt_number: int, role: str, method: str,
           timestamp: datetime) -> CallSecurityEvent:  # fmt: skip
        return cls(source=event.source, event=event.event, detail=bounded(event.detail) or "", attempt_id=attempt_id,
                   attempt_number=attempt_number, role=role, method=method, timestamp=timestamp)  # fmt: skip


class NestedCallSummary(BaseModel):
    """A nested call made by an attempt that was rolled back (its own record was discarded with it)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    role: str
    method: str
    status: Literal["ok", "error"]
    error_type: str | None = None
    security_events: list[CallSecurityEvent] = Field(
        default_factory=list, description="its security events (the parent's record lists them too)"
    )


class EgressCall(BaseModel):
    """One request the attempt's program asked the host to make (issue 18): written by the host from the
    broker's record, never by the program. Credentials never appear (the broker redacts them)."""

    model_config = ConfigDict(extra="forbid")

    method: str
    url: str = Field(description="as requested, normalised, without credentials")
    final_url: str | None = Field(None, description="after the redirects the broker followed")
    status: int | None = None
    bytes: int = Field(0, description="body bytes received (decompressed)")
    duration_ms: float = 0.0
    rule: str | None = Field(None, description="the allow entry that matched (the last hop's)")
    denied: str | None = Field(None, description="why the request failed, when it did (the rule or missing grant)")
    error: str | None = Field(None, description="the error kind, when it failed (egress_denied, network_error...)")
    redirects: list[str] = Field(default_factory=list, description="each hop's URL after the first")

    @classmethod
    def bounded(cls, records: list[dict[str, Any]]) -> list[EgressCall]:
        """Records from outcome metadata as call-log entries: at most MAX_EGRESS_RECORDS, text bounded,
        anything unreadable skipped (the metadata is the host's own, so that would be a host bug)."""
        out: list[EgressCall] = []
        budget = MAX_EGRESS_URL_CHARS
        for raw in records[:MAX_EGRESS_RECORDS]:
            try:
                call = cls.model_validate(raw)
            except ValidationError:
                log.warning("unreadable egress record skipped")
                continue
            call.url = bounded(call.url, MAX_URL_CHARS) or ""
            call.final_url = bounded(call.final_url, MAX_URL_CHARS)
            call.denied = bounded(call.denied)
            call.rule = bounded(call.rule)
            call.redirects = [bounded(url, MAX_URL_CHARS) or "" for url in call.redirects[:30]]
            budget -= len(call.url) + len(call.final_url or "") + sum(map(len, call.redirects))
            if budget < 0:  # the rest are still counted (``egress_requests``), not kept
                break
            out.append(call)
        return out


class AttemptFailure(BaseModel):
    """One failed attempt (ADR 0016 section 7). Internal diagnostics: logs and metadata only."""

    model_config = ConfigDict(extra="forbid")

    attempt_id: str
    attempt_number: int = Field(ge=1)
    call_id: str
    stage: FailureStage
    error_class: str = Field(description="exception class, violation type or outcome error type")
    error_type: str | None = None
    error_message: str = Field(max_length=MAX_MESSAGE_CHARS)
    failure_class: str | None = Field(
        None, description="intrinsic/adaptive/extrinsic, or recoverable/terminal for guardrails"
    )
    violation_location: str | None = None
    program_source: ProgramSourceField | None = Field(None, title="Program Source")
    timestamp: AwareDatetime
    discarded_nested_calls: list[NestedCallSummary] = Field(default_factory=list)
    egress: list[EgressCall] = Field(
        default_factory=list, description="the requests this attempt's program had the host make (issue 18)"
    )
    security_event: SecurityEvent | None = Field(
        None, description="what ended this attempt's execution, when it was a security event (docs/security.md)"
    )


class Capability(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str
    granted: bool | None = None
    evidence: list[str] = Field(default_factory=list, description="'line:column construct', at most 5")


def capability(found: FoundCapability) -> Capability:
    """The call record's view of a capability the policy found: its tag, grant and first five pieces of evidence."""
    evidence = [bounded(f"{e.line}:{e.column} {e.construct}", 200) or "" for e in found.evidence[:5]]
    return Capability(tag=found.tag, granted=found.granted, evidence=evidence)


class Usage(BaseModel):
    """What the sandbox measured for the attempt that produced the outcome."""

    model_config = ConfigDict(extra="forbid")

    cpu_time_s: float = 0.0
    peak_memory_mb: float = 0.0
    source: Literal["host", "sandbox"] = "host"
    sandbox_duration_s: float = 0.0
    total_sandbox_duration_s: float = Field(0.0, description="summed over every attempt of the call")
    bridge_duration_s: float = Field(
        0.0, description="seconds the call's executions waited for their nested calls (summed over attempts); "
        "charged to each execution's time limit, not part of sandbox_duration_s",
    )  # fmt: skip
    fetch_duration_s: float = Field(
        0.0, description="seconds the call's executions waited for the host's fetches (summed over attempts); "
        "charged to each execution's time limit",
    )  # fmt: skip


class FileRecord(BaseModel):
    """A file of a run, as the log says it: name, size and sha256 (``runtime/files/transfer.manifest``)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class _CallFields(BaseModel):  # type: ignore[no-redef]  # pydantic's mypy plugin: field named `kwargs`
    """The call's own fields; :class:`CallRecord` adds the store's (``runtime.store.logfields``) after them."""

    model_config = ConfigDict(defer_build=True)  # a base, never validated itself: no validator of its own

    schema_version: Literal[1] = 1
    # identity
    trace_id: str
    call_id: str
    parent_call_id: str | None = None
    depth: int = Field(ge=0)
    role: str
    method: str
    source: CallSource = Field(
        "agent", description="who asked: agent (a tool call through the lifecycle), or a run of a program the "
        "caller handed in: cli (sandforge exec), http (POST /v1/exec), mcp (run_tool_code), framework (an agent "
        "framework's code-execution tool: sandforge.integrations)",
    )  # fmt: skip
    args: JsonValue = None
    kwargs: JsonValue = None
    started_at: AwareDatetime
    duration_s: float = Field(ge=0)
    # the program of the last attempt
    program_source: ProgramSourceField | None = Field(None, title="Program Source")
    program_code: str | None = None
    program_sha256: str | None = None
    dependencies: list[str] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    provider_calls: int = 0
    # outcome
    status: Literal["ok", "error"]
    value: JsonValue = None
    error_type: str | None = None
    error_message: str | None = None
    retriable: bool = False
    failure_class: str | None = None
    normalization_policy: str | None = Field(
        None, description="versioned rule that replaced the top-level error message (boundary-normalization/v1)"
    )
    tool_error: bool = Field(False, description="the error is the program's own Outcome.error, returned as its answer")
    # ADR 0016 section 6
    attempt_id: str
    attempts: int = Field(ge=0)
    attempt_stage: AttemptStage
    validation_failure_type: str | None = None
    rollback_applied: bool = False
    retry_feedback_injected: bool = False
    generation_retry_attempts: int = 0
    generation_retry_exhausted: bool = False
    guardrail_recovery_attempts: int = 0
    guardrail_retry_exhausted: bool = False
    execution_repair_attempts: int = 0
    execution_repair_exhausted: bool = False
    outcome_repair_attempts: int = 0
    outcome_repair_triggered: bool = False
    outcome_repair_retry_exhausted: bool = False
    latest_failure_stage: FailureStage | None = None
    latest_failure_class: str | None = None
    latest_failure_message: str | None = None
    # ADR 0016 section 7
    attempt_failures: list[AttemptFailure] = Field(default_factory=list)
    # issue 36: every security event of the call, its attempts' and its discarded nested calls'
    security_events: list[CallSecurityEvent] = Field(
        default_factory=list,
        description="each execution of this call (or of a nested call its rolled-back attempts discarded) that "
        "ended on a security event: source (tripwire, inner_wall, host), event, detail, attempt and tool; "
        "nothing such an attempt did was committed",
    )
    # validation of the last attempt
    verdict: str | None = None
    capabilities: list[Capability] = Field(default_factory=list)
    policy_fingerprint: str | None = None
    # execution of the last attempt
    backend: str | None = None
    protections: dict[str, bool] = Field(
        default_factory=dict,
        description="the walls the last attempt's sandbox was verified to have before it ran (name: present)",
    )
    usage: Usage = Field(default_factory=Usage)
    nested_calls: int = 0
    egress_requests: int = Field(0, description="requests the last attempt's program had the host make")
    egress: list[EgressCall] = Field(
        default_factory=list,
        description="their provenance, one entry per request (at most 100): method, URL without credentials, "
        "final URL, status, bytes, duration, the allow rule that matched or why it was denied",
    )
    stdout: str | None = None
    # files in the transaction (issue 41): what went in, and what an ok run committed; never their contents
    input_files: list[FileRecord] | None = Field(None, description="the run's input files (absent: none)")
    output_files: list[FileRecord] | None = Field(
        None, description="the outputs/ files an ok run returned to be committed (absent: none)"
    )
    # the last attempt's environment (issue 19; absent when its program declared no dependency)
    env_id: str | None = Field(None, description="the environment the program ran with (docs/environments.md)")
    environment_cache_hit: bool | None = Field(None, description="the environment was ready: nothing was built")
    env_prepare_ms: float | None = Field(None, ge=0, description="manifest to ready environment, milliseconds")
    env_resolve_ms: float | None = Field(None, ge=0, description="resolution, when this call built it")
    env_install_ms: float | None = Field(None, ge=0, description="install and bytecode, when this call built it")
    trace_usage: TraceUsage | None = Field(None, description="what the whole trace had spent when this call ended")


class CallRecord(StoreLogFields, _CallFields):
    """One logical call. Field names of ADR 0016 sections 6 and 7 are kept verbatim."""

    # Its fields are the call's own, then the ToolStore's (``runtime.store.logfields.StoreLogFields``, declared
    # once by the store), flat in the JSON: the order of the bases keeps the published field order.

    model_config = ConfigDict(extra="forbid", defer_build=False)  # built at import (its bases are not)

    @staticmethod
    def code_fields(code: str | None) -> dict[str, Any]:
        if code is None:
            return {"program_code": None, "program_sha256": None}
        try:  # the bytes ``sandforge exec`` read (undecodable ones are surrogate escapes)
            data = code.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate no bytes decode to (JSON's "\ud800"): one digest still
            data = code.encode("utf-8", "surrogatepass")
        return {"program_code": bounded(code, MAX_CODE_CHARS), "program_sha256": hashlib.sha256(data).hexdigest()}


#: Fields a program store may fill in (``ProgramPlan.log_fields``, ``PromptExtras.log_fields`` and the
#: record it returns); the lifecycle ignores any other key a store proposes.
STORE_FIELDS: frozenset[str] = STORE_LOG_FIELDS


def call_log_schema() -> dict[str, Any]:
    """The JSON Schema published as docs/schemas/call-log.schema.json."""
    schema = CallRecord.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "call-log.schema.json"
    return schema


def default_log_path() -> Path:
    """``$SANDFORGE_CALL_LOG``, else ``<state dir>/logs/calls.jsonl`` (state dir: ``$SANDFORGE_STATE_DIR``)."""
    env = os.environ.get(LOG_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return resolve_state_dir() / "logs" / "calls.jsonl"


class CallLog:
    """Appends records to a JSONL file (when it has a path) and keeps the latest ``keep`` in memory."""

    def __init__(self, path: Path | str | None = None, *, keep: int = 1000) -> None:
        self.path = Path(path).expanduser() if path is not None else None
        self._recent: deque[CallRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()

    @property
    def records(self) -> list[CallRecord]:
        """The records written by this process (the latest ``keep``), oldest first."""
        with self._lock:
            return list(self._recent)

    def append(self, record: CallRecord) -> None:
        if (problem := self.write(record)) is not None:  # a full disk must not turn a successful call into a failure
            log.warning("cannot write the call log %s: %s", self.path, problem)

    def write(self, record: CallRecord) -> OSError | None:
        """:meth:`append`, returning why the file could not be written (None: it was, or there is no file)
        instead of logging it: ``sandforge exec`` says it in its own one line."""
        line = (record.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            self._recent.append(record)
            if self.path is None:
                return None
            # O_NONBLOCK: a FIFO in the log's place fails the open instead of hanging; only a regular file is
            # appended to (files/dirs created 0600/0700: records hold arguments and values)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                try:
                    fd = os.open(self.path, flags, 0o600)
                except FileNotFoundError:  # first record: create the directory (not on every call: mkdir costs)
                    from sandforge.runtime.files.dirs import make_dirs  # 0700 at every level it creates

                    make_dirs(self.path.parent)
                    fd = os.open(self.path, flags, 0o600)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise OSError(errno.EINVAL, "not a regular file")
                    os.write(fd, line)  # one write per line: O_APPEND keeps concurrent writers' lines whole
                finally:
                    os.close(fd)
            except OSError as exc:
                return exc
        return None


def parse_record(line: str) -> CallRecord | None:
    """One log line as a record, or None when it is blank or not a current-version record."""
    line = line.strip()
    if not line:
        return None
    try:
        return CallRecord.model_validate_json(line)
    except ValidationError:
        return None


def read_records(path: Path) -> Iterator[CallRecord]:
    """Every readable record of a log file, in order; malformed lines are skipped (and logged)."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            record = parse_record(line)
            if record is None and line.strip():
                log.warning("%s:%d: not a call record; skipped", path, number)
            elif record is not None:
                yield record


def now_utc() -> datetime:
    from datetime import UTC

    return datetime.now(UTC)
