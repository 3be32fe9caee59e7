"""The MCP tools' work, as plain functions of one tenant's runtime (no MCP types here).

Each returns its result model or raises :class:`Failed` carrying a :class:`ToolFailure`: the server turns
that into an ``isError`` result (``failure_result.error_result``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import JsonValue, ValidationError

from sandforge.runtime.agent.egress import StandaloneBridge
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.agent.runs import RunClock, run_record
from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.transfer import manifest
from sandforge.runtime.guardrails import ValidationResult, validate
from sandforge.runtime.guardrails.report import explain, suggestions
from sandforge.runtime.service.mcp.models import (
    CallOutcome,
    Failed,
    MethodSummary,
    PolicyPage,
    RunResult,
    ToolDetail,
    ToolList,
    ToolSummary,
    ValidationReport,
    Violation,
    fail,
)
from sandforge.runtime.service.mcp.tenant import TenantPort
from sandforge.runtime.store.toolstore import ArtifactHealth, LookupStatus
from sandforge.sandbox import ExecutionOutcome, ExecutionRequest, Limits

log = logging.getLogger(__name__)


def _violations(result: ValidationResult) -> list[Violation]:
    return [
        Violation(
            rule=v.violation_type,
            classification=str(v.classification),
            message=v.message,
            line=v.location.line if v.location else None,
            fix=v.required_correction or None,
        )
        for v in result.violations
    ]


def validate_code(rt: TenantPort, code: str) -> ValidationReport:
    result = validate(code, rt.policy)
    return ValidationReport(
        verdict=result.verdict,
        violations=_violations(result),
        capabilities=sorted({c.tag for c in result.capabilities}),
        policy_fingerprint=result.policy_fingerprint,
    )


def _limits(rt: TenantPort, timeout_s: float | None, memory_mb: int | None) -> Limits:
    """The tenant's limits, lowered by the request; asking for more than the tenant allows is refused."""
    base = rt.default_limits
    max_timeout, max_memory = rt.limit_caps
    if timeout_s is not None and timeout_s > max_timeout:
        raise fail("limit_exceeded", f"timeout_s {timeout_s:g} is above this tenant's largest, {max_timeout:g}")
    if memory_mb is not None and memory_mb > max_memory:
        raise fail("limit_exceeded", f"memory_mb {memory_mb} is above this tenant's largest, {max_memory}")
    overrides: dict[str, Any] = {}
    if timeout_s is not None:
        overrides["timeout_s"] = timeout_s
    if memory_mb is not None:
        overrides["memory_mb"] = memory_mb
    try:
        return Limits(**{**base.model_dump(), **overrides})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise fail("invalid_request", f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def _execution_failure(outcome: ExecutionOutcome) -> Failed:
    details: dict[str, Any] = {}
    if outcome.metadata.get("violations"):
        details["violations"] = [
            {"rule": v.get("violation_type"), "message": v.get("message"), "fix": v.get("required_correction")}
            for v in outcome.metadata["violations"]
        ]
    for key in ("tool_error_type", "exception", "line"):  # the program's own error type, what it raised, where
        if outcome.metadata.get(key) is not None:
            details[key] = outcome.metadata[key]
    if outcome.security_event is not None:
        details["security_event"] = outcome.security_event.model_dump(mode="json")
    if outcome.stderr:
        details["stderr"] = outcome.stderr
    error_type = outcome.error_type.value if outcome.error_type else "execution"
    return fail(error_type, outcome.error_message or error_type, retriable=outcome.retriable, **details)


class InputFiles(NamedTuple):
    """``run_tool_code``'s input files: inline (name -> base64) and by reference (name -> a stored file's URI)."""

    inline: Mapping[str, str] = {}
    refs: Mapping[str, str] = {}


def _kept(rt: TenantPort, files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The outputs' listing, each kept in the tenant's stored files (its ``uri``) as ``POST /v1/exec`` keeps
    them: the dashboard's call page shows them, a later run takes them by reference. Over the stored-file
    quota they are not kept (``uri`` None); the result carries their bytes either way."""
    from sandforge.runtime.service.uploads import FILE_URI

    listed = manifest(files)
    if not files:
        return listed
    try:
        kept = rt.uploads.put_all(files.items(), kind="output")
    except SandforgeError as exc:  # over the quota (StoreFull), or the disk refused
        log.info("outputs not kept: %s", exc)
        return listed
    return [{**item, "uri": FILE_URI.format(id=record.id)} for item, record in zip(listed, kept, strict=True)]


def run_tool_code(
    rt: TenantPort,
    code: str,
    context: dict[str, JsonValue],
    args: list[JsonValue],
    kwargs: dict[str, JsonValue],
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    files: InputFiles | None = None,
) -> RunResult:
    limits = _limits(rt, timeout_s, memory_mb)
    files = files or InputFiles()
    inputs: dict[str, str | bytes] = dict(files.inline)  # base64 text, as in JSON
    if files.refs:
        from sandforge.runtime.service.uploads import BadReference

        try:
            inputs.update(rt.uploads.referenced(files.refs, files.inline, limits))
        except BadReference as exc:  # another tenant's file included: not found, as a made-up one
            raise fail("invalid_request", str(exc)) from None
    try:
        request = ExecutionRequest(code=code, context=context, args=args, kwargs=kwargs, limits=limits,
                                   files=inputs)  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        raise fail("invalid_request", f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    workspace = rt.workspace  # the program's declared environment too, as sandforge exec
    bridge = StandaloneBridge.of(rt.policy)  # its fetches brokered under the tenant's egress rules, as exec does
    clock = RunClock()
    outcome, verdict = execute_program(workspace.sandbox, request, policy=rt.policy, backend=rt.backend,
                                       bridge=bridge, environments=workspace.environments)  # fmt: skip
    outcome = bridge.fetches.attach(outcome)
    # into the tenant's call log (the workspace's), failed or not (issue 37)
    workspace.log.append(run_record(outcome, verdict, request, source="mcp", clock=clock))
    if not outcome.ok:
        raise _execution_failure(outcome)
    result = RunResult(
        status="ok",
        value=outcome.value,
        context=dict(outcome.context or {}),
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        backend=outcome.backend or "",
        duration_s=outcome.duration_s,
        capabilities=list(outcome.metadata.get("capabilities", [])),
        files=_kept(rt, outcome.files),
    )
    result._bytes = dict(outcome.files)
    return result


def list_tools(rt: TenantPort) -> ToolList:
    return ToolList(
        tools=[
            ToolSummary(
                role=e.role,
                purpose=e.purpose,
                methods=list(e.methods),
                usage_count=e.usage_count,
                success_count=e.success_count,
                failure_count=e.failure_count,
                last_used_at=e.last_used_at,
            )
            for e in rt.store.list_tools()
        ]
    )


def method_summary(row: ArtifactHealth, mcp_tool: str | None) -> MethodSummary:
    return MethodSummary(
        method=row.method_name,
        generation=row.generation,
        health=row.health.value if row.health else None,
        reusable=row.reusable,
        checksum_ok=row.checksum_ok,
        status=row.status.value,
        mcp_tool=mcp_tool,
    )


def get_tool(rt: TenantPort, role: str, method: str | None, names: dict[tuple[str, str], str]) -> ToolDetail:
    """``names`` maps (role, method) to the MCP tool exposing it (see ``persisted.exposed``)."""
    store = rt.store
    entry = store.get_tool(role)
    if entry is None:
        raise fail("tool_not_found", f"no tool {role!r} in this tenant's store")
    rows = store.health_report([role])
    code = None
    if method is not None:
        rows = [r for r in rows if r.method_name == method]
        lookup = store.lookup(role, method)
        if lookup.status is not LookupStatus.FOUND or lookup.artifact is None or not rows:
            raise fail("tool_not_found", f"no stored method {method!r} of tool {role!r}")
        code = lookup.artifact.code
    return ToolDetail(
        role=entry.role,
        purpose=entry.purpose,
        deliverable=entry.deliverable,
        acceptance=entry.acceptance,
        failure_policy=entry.failure_policy,
        contract_fingerprint=entry.contract_fingerprint,
        capabilities=list(entry.capabilities),
        methods=[method_summary(r, names.get((r.role, r.method_name))) for r in rows],
        code=code,
    )


def _outcome_failure(outcome: Outcome) -> Failed:
    details: dict[str, Any] = {"tool_role": outcome.tool_role, "method_name": outcome.method_name}
    violations = outcome.metadata.get("violations")
    if violations:
        details["violations"] = violations
    if events := outcome.metadata.get("security_events"):
        details["security_events"] = events
    for key in ("failure_class", "tool_error"):  # the lifecycle's lane of this answer (ADR 0016)
        if outcome.metadata.get(key) is not None:
            details[key] = outcome.metadata[key]
    error_type = outcome.error_type or "execution"
    return fail(error_type, outcome.error_message or error_type, retriable=outcome.retriable, **details)


def call_stored_tool(
    rt: TenantPort, role: str, method: str, args: list[JsonValue], kwargs: dict[str, JsonValue],
    files: Mapping[str, bytes] | None = None,
) -> CallOutcome:  # fmt: skip
    """``role.method(*args, **kwargs)`` through the tenant's lifecycle: a healthy stored artifact is reused.
    ``files``: its input files (the contract's declared ones); an ok call's outputs come back with it."""
    try:
        if files:
            outcome = rt.workspace.call_with_files(role, method, files, *args, **kwargs)
        else:
            outcome = rt.workspace.call(role, method, *args, **kwargs)
    except ValidationError as exc:  # input files past the tenant's limits, or badly named
        err = exc.errors()[0]
        raise fail("invalid_request", f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    except (TypeError, ValueError, SandforgeError) as exc:  # arguments the call refuses before it starts
        raise fail("invalid_request", str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if not outcome.ok:
        raise _outcome_failure(outcome)
    source = outcome.metadata.get("program_source")
    result = CallOutcome(
        status="ok",
        value=outcome.value,
        tool_role=outcome.tool_role,
        method_name=outcome.method_name,
        program_source=str(source) if source is not None else None,
        files=_kept(rt, outcome.files),  # kept as run_tool_code keeps its outputs
    )
    result._bytes = dict(outcome.files)
    return result


def explain_policy(rt: TenantPort, name: str) -> PolicyPage:
    policy = rt.policy
    page = explain(policy, name)
    if page is None:
        raise fail("unknown_rule", f"no rule or capability named {name!r}", suggestions=suggestions(policy, name))
    return PolicyPage(name=name, page=page)
