"""An MCP error result every client accepts: ``isError``, text content, no ``structuredContent``.

Every tool declares an ``outputSchema`` for its success shape. The TypeScript SDK 1.x client (and MCP
Inspector, built on it) validates any ``structuredContent`` against that schema even when ``isError`` is
true, and throws ``-32602`` instead of returning the result; the Python SDK and the TypeScript SDK 2.x skip
the check for errors. A result without ``structuredContent`` passes all three, and the specification asks
for conforming structured content only of results that are not errors. So a failure travels as two text
blocks: what a model reads (the error, each fix, the lane: what to do next) and the :class:`ToolFailure`
as JSON for programs (``error_type``, ``retriable``, ``details``).
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types import CallToolResult, TextContent

from sandforge.runtime.agent.failures import EXECUTION_FAILURES, FailureClass, classify_failure
from sandforge.runtime.service.mcp.models import ToolFailure

#: Refusals of the MCP server itself: the call's arguments or name, before anything ran.
REQUEST_ERRORS = frozenset({"invalid_request", "limit_exceeded", "unknown_tool", "tool_not_found", "unknown_rule"})
#: The policy refused the program (or its dependencies) before it ran.
GUARDRAIL_ERRORS = frozenset(
    {"guardrail_violation", "guardrail_retry_exhausted", "invalid_dependency_manifest", "dependency_policy_violation"}
)
_EXECUTION = frozenset(e.value for e in EXECUTION_FAILURES) | {"contract_violation"}


def lane(failure: ToolFailure) -> tuple[str, str]:
    """The failure's lane (ADR 0016's names, plus the server's own ``request``, ``quota`` and ``server``) and
    what a caller does about it."""
    kind, details = failure.error_type, failure.details
    if kind in REQUEST_ERRORS:
        return "request", "nothing ran: change the arguments or the tool name"
    if kind == "quota_exceeded":
        return "quota", f"the tenant's quota: retry in {details.get('retry_after_s', 'a few')} s"
    if kind in ("store_error", "refused", "shutting_down"):
        return "server", "the server could not take the call now"
    if kind in GUARDRAIL_ERRORS or (details.get("violations") and kind not in _EXECUTION):
        return "guardrail", "the policy refused the program before it ran: change it as each fix says"
    if kind == "tool_error" or details.get("tool_error"):
        return "outcome", "the program answered with its own error (Outcome.error): an answer, not a crash"
    cls = details.get("failure_class") or classify_failure(kind).value
    if cls == FailureClass.EXTRINSIC.value:
        return "extrinsic", "the host saw the cause, not a defect of the program"
    if kind in _EXECUTION:
        return "execution", "the program raised or misbehaved while running: change the program"
    return str(cls), "see error_type"


def _fix_lines(details: dict[str, Any]) -> list[str]:
    lines = []
    for v in details.get("violations") or []:
        if not isinstance(v, dict):
            continue
        fix = v.get("fix") or v.get("required_correction")
        rule = v.get("rule") or v.get("violation_type")
        if fix:
            where = f", line {v['line']}" if v.get("line") else ""
            lines.append(f"fix ({rule}{where}): {fix}")
    return lines


def _security_events(details: dict[str, Any]) -> list[str]:
    """``source event`` of each security event a failure's details carry (a run's one, a call's list)."""
    single = details.get("security_event")
    events = [single] if single is not None else details.get("security_events") or []
    return [f"{e.get('source')} {e.get('event')}" for e in events if isinstance(e, dict)]


def describe(failure: ToolFailure) -> str:
    """What a model reads: the error, what the program raised or answered, each fix, the lane."""
    details = failure.details
    lines = [f"{failure.error_type}: {failure.error_message}"]
    if details.get("exception"):
        at = f" at line {details['line']}" if details.get("line") else ""
        lines.append(f"raised: {details['exception']}{at}")
    if details.get("tool_error_type"):
        lines.append(f"the program's error type: {details['tool_error_type']}")
    lines += _fix_lines(details)
    if events := _security_events(details):  # said in the text clients show too, not only in the data
        lines.append(f"security event: {', '.join(events)}")
    name, advice = lane(failure)
    lines.append(f"lane: {name} ({advice}; {'retriable' if failure.retriable else 'not retriable'})")
    return "\n".join(lines)


def error_result(failure: ToolFailure) -> CallToolResult:
    """The ``isError`` result of ``failure``: readable text, then the failure as JSON; no structured content."""
    data = json.dumps(failure.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    content = [TextContent(type="text", text=describe(failure)), TextContent(type="text", text=data)]
    return CallToolResult(content=content, is_error=True)
