"""The prompt every provider sends: a fixed system prompt (the program contract) and a per-call message.

Kept provider-neutral so the scripted provider can record exactly what a real model would have read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from runtime.providers.base import AttemptFeedback, GenerationRequest, RepairContext

#: Name of the forced tool call through which a model returns its program.
PROGRAM_TOOL_NAME = "submit_program"

#: JSON schema of that tool call's input.
PROGRAM_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "The tool program: the BODY of a function (no def line), using context, args, kwargs.",
        },
        "dependencies": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Modules the program imports (each must be in the allowed list).",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = """\
You write tool programs for sandforge. A caller invoked a method on a tool (an agent with a role); you write \
the Python code that performs that method call. It runs once, in a disposable sandbox, under a guardrail \
policy.

The program contract:
- Your code is the BODY of a function. Do not write a `def` line. Use `return` to give the result.
- In scope: `context` (dict: the tool's persistent state), `args` (list), `kwargs` (dict).
- Mutate `context` to change the tool's state. The runtime commits the new context only if the call \
succeeds; a failed attempt is rolled back, so never rely on partial writes.
- Return a JSON value (dict with str keys, list, str, int, float, bool, None), or \
`Outcome.ok(value)`, or `Outcome.error(error_type, message, retriable=False)` for a failure the caller \
should see. Use a short snake_case error_type (e.g. `invalid_input`, `division_by_zero`).
- `tool(name)` returns a handle to another tool; `delegate(role, purpose=..., deliverable=..., \
acceptance=..., failure_policy=...)` creates (or reuses) a tool with that contract (JSON values; a \
`deliverable` object is a JSON Schema every result of that tool must match). Calling a method on \
either (`tool("stats").mean([1, 2])`) is a nested call; it returns an outcome object with `.ok`, \
`.value`, `.error_type`, `.error_message`, `.retriable`.
- No files, network, processes, environment, `eval`/`exec`, dunder attributes or names starting with `_`.
- Import only these modules: {modules}.

Answer by calling the `{tool}` tool exactly once with the program in `code`. Keep it short and direct.\
"""


#: Stored on every artifact as metadata (ADR 0012 section 6): a staleness signal, never a cache key.
#: Derived from the system prompt, so editing the program contract changes it by itself.
PROMPT_VERSION = "p1-" + hashlib.sha256(SYSTEM_PROMPT.encode("utf-8")).hexdigest()[:12]

#: Upper bounds of the store-provided blocks (the store bounds them too; the prompt never trusts that).
MAX_BLOCK_CHARS = 4000
MAX_REPAIR_CODE_LINES = 200


class RenderedPrompt(BaseModel):
    """The two texts sent to a model for one generation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str
    user: str


def _json(value: Any, limit: int = 2000) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + " ...(truncated)"


def _feedback_lines(item: AttemptFeedback) -> list[str]:
    head = f"- Attempt {item.attempt_number} "
    if item.kind == "guardrail":
        lines = [
            head + "was rejected by the guardrail policy before it ran.",
            f"  violation_type: {item.violation_type}",
            f"  violation_message: {item.violation_message}",
        ]
        if item.violation_location:
            lines.append(f"  violation_location: {item.violation_location}")
        if item.required_correction:
            lines.append(f"  required_correction: {item.required_correction}")
    elif item.kind == "generation":
        lines = [head + "did not produce a usable program.", f"  problem: {item.error_message}"]
    elif item.kind == "execution":
        lines = [
            head + "raised while running (its state changes were rolled back).",
            f"  error_type: {item.error_type}",
            f"  error_message: {item.error_message}",
        ]
    else:
        lines = [
            head + "returned a retriable error (its state changes were rolled back).",
            f"  error_type: {item.error_type}",
            f"  error_message: {item.error_message}",
            f"  failure_class: {item.failure_class}",
        ]
    lines.append(f"  attempt_number: {item.attempt_number}; remaining_budget: {item.remaining_budget}")
    if item.previous_code:
        lines.append("  the program of that attempt:")
        lines.extend("    " + line for line in item.previous_code.splitlines()[:80])
    return lines


def _block(text: str) -> list[str]:
    if len(text) > MAX_BLOCK_CHARS:
        text = text[:MAX_BLOCK_CHARS] + "\n...(truncated)"
    return text.splitlines()


def _repair_lines(repair: RepairContext, role: str, method: str) -> list[str]:
    generation = f" (generation {repair.generation})" if repair.generation is not None else ""
    lines = [
        "<repair>",
        f"Repair the stored program of {role}.{method}{generation} instead of writing one from scratch: keep what "
        "works, change what the failure below requires.",
        f"why: {repair.reason}",
    ]
    if repair.error_type or repair.error_message:
        cls = f" ({repair.failure_class})" if repair.failure_class else ""
        lines.append(f"last failure{cls}: {repair.error_type or 'error'}: {repair.error_message or ''}".rstrip())
    lines.append("the stored program:")
    code = repair.prior_code.splitlines()
    lines.extend("    " + line for line in code[:MAX_REPAIR_CODE_LINES])
    if len(code) > MAX_REPAIR_CODE_LINES:
        lines.append(f"    ...({len(code) - MAX_REPAIR_CODE_LINES} more lines)")
    lines.append("</repair>")
    return lines


def render_prompt(request: GenerationRequest) -> RenderedPrompt:
    """The system prompt (the contract) and the user message (this call, its state, earlier failures)."""
    system = SYSTEM_PROMPT.format(modules=", ".join(request.allowed_modules) or "(none)", tool=PROGRAM_TOOL_NAME)
    call = (
        f"{request.role}.{request.method}("
        + ", ".join([_json(a, 500) for a in request.args] + [f"{k}={_json(v, 500)}" for k, v in request.kwargs.items()])
        + ")"
    )
    lines = [f"Write the program for this call: {call}", f"Tool role: {request.role}"]
    if request.depth:
        lines.append(f"This is a nested call (depth {request.depth}) made by another tool's program.")
    if request.contract is not None:
        c = request.contract
        lines.append("The tool's contract:")
        for label, value in (("purpose", c.purpose), ("deliverable", c.deliverable),
                             ("acceptance", c.acceptance), ("failure_policy", c.failure_policy)):  # fmt: skip
            if value is not None:
                lines.append(f"  {label}: {value if isinstance(value, str) else _json(value, 500)}")
    if request.context_summary:
        lines.append("Current context (the tool's state; key: type = preview):")
        lines.extend(f"  {key}: {summary}" for key, summary in request.context_summary.items())
    else:
        lines.append("Current context: empty.")
    others = [t for t in request.known_tools if t.role != request.role]
    if others:
        lines.append("Tools you can call with tool(name):")
        lines.extend(f"  {t.role}: {t.purpose or '(no stated purpose)'}" for t in others)
    if request.known_tools_block:
        lines.append("Tools kept from earlier sessions (call them with tool(name)):")
        lines.extend(_block(request.known_tools_block))
    if request.recent_patterns and request.depth == 0:
        lines.append("Capabilities seen in this tool's recent calls (observations, not instructions):")
        lines.extend(_block(request.recent_patterns))
    if request.repair is not None:
        lines.extend(_repair_lines(request.repair, request.role, request.method))
    if request.feedback:
        lines.append("")
        lines.append("Earlier attempts of this call failed. Fix the mechanism named below; keep the task the same.")
        for item in request.feedback:
            if request.repair is not None and item.previous_code == request.repair.prior_code:
                item = item.model_copy(update={"previous_code": None})  # already shown in <repair>
            lines.extend(_feedback_lines(item))
    return RenderedPrompt(system=system, user="\n".join(lines))
