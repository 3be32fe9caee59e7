"""What the session's history says: which groups were loaded (RFC-044), and the model-facing transcript."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sandforge.runtime.sessions.groups import LOAD_TOOL_GROUP
from sandforge.runtime.sessions.models import Message, MessageType, ToolStatus


def restore_loaded_groups(messages: Iterable[Message]) -> list[str]:
    """RFC-044 ``restoreLoadedGroups``: the groups successfully loaded by earlier ``load_tool_group`` calls.

    Only TOOL_CALL messages named ``load_tool_group`` with status SUCCESS count; a ``tool_input`` that is not
    a JSON object with a string ``group_name`` is skipped; a group loaded several times is returned once
    (first-load order, so the tool list offered to the model is stable). Whether a group still exists is the
    caller's business (a vanished group simply contributes no tools). O(n), one pass, no allocation per
    message that is not a candidate.
    """
    groups: dict[str, None] = {}
    for msg in messages:
        if (
            msg.type is MessageType.TOOL_CALL
            and msg.tool_name == LOAD_TOOL_GROUP
            and msg.tool_status is ToolStatus.SUCCESS
            and msg.tool_input is not None
        ):
            try:
                params = json.loads(msg.tool_input)
            except (ValueError, TypeError, RecursionError):  # malformed or 100,000-deep tool_input: skip
                continue
            if isinstance(params, dict):
                name = params.get("group_name")
                if isinstance(name, str) and name:
                    groups[name] = None
    return list(groups)


def _parse_input(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def to_api_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Rebuild the Anthropic ``messages`` list from persisted history.

    One model response is persisted as assistant text(s), then its tool calls, then their results; this
    folds them back into alternating user/assistant messages with content blocks. It is tolerant of
    damaged history (a crash mid-turn, rows from other writers): a tool_use without a result gets a
    synthetic error result, a result without its tool_use is dropped, malformed inputs become ``{}``,
    empty text is omitted, and the transcript always starts with a user message.
    """
    api: list[dict[str, Any]] = []

    def push(role: str, block: dict[str, Any]) -> None:
        if api and api[-1]["role"] == role:
            api[-1]["content"].append(block)
        else:
            api.append({"role": role, "content": [block]})

    for m in messages:
        if m.type is MessageType.USER:
            if m.content:
                push("user", {"type": "text", "text": m.content})
        elif m.type is MessageType.ASSISTANT:
            if m.content:
                push("assistant", {"type": "text", "text": m.content})
        elif m.type is MessageType.TOOL_CALL:
            call_id = m.tool_call_id or f"toolu_restored_{m.id}"
            push(
                "assistant",
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": m.tool_name or "unknown",
                    "input": _parse_input(m.tool_input),
                },
            )
        elif m.type is MessageType.TOOL_RESULT and m.tool_call_id:
            push(
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content,
                    "is_error": m.tool_status is ToolStatus.ERROR,
                },
            )
    return _repair(api)


def _repair(api: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # tool_use ids of the previous assistant message
    for msg in api:
        if msg["role"] == "assistant":
            if pending:  # assistant after assistant-with-tool-use: results are missing entirely
                out.append({"role": "user", "content": _missing_results(pending)})
            pending = [b["id"] for b in msg["content"] if b["type"] == "tool_use"]
            out.append(msg)
            continue
        results = [b for b in msg["content"] if b["type"] == "tool_result" and b["tool_use_id"] in pending]
        have = {b["tool_use_id"] for b in results}
        missing = _missing_results([i for i in pending if i not in have])
        others = [b for b in msg["content"] if b["type"] != "tool_result"]
        content = results + missing + others
        pending = []
        if not content:
            continue
        if out and out[-1]["role"] == "user":
            out[-1]["content"].extend(content)
        else:
            out.append({"role": "user", "content": content})
    if pending:
        out.append({"role": "user", "content": _missing_results(pending)})
    # The transcript must open with a user message, and a result needs the tool_use right before it.
    while out and (out[0]["role"] != "user" or all(b["type"] == "tool_result" for b in out[0]["content"])):
        out.pop(0)
    if out:
        out[0]["content"] = [b for b in out[0]["content"] if b["type"] != "tool_result"]
    return out


def _missing_results(ids: list[str]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_result", "tool_use_id": i, "content": "tool call was interrupted; no result", "is_error": True}
        for i in ids
    ]
