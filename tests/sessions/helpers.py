"""Shared test doubles for the session tests (also imported by the two-process worker)."""

from __future__ import annotations

import threading
from typing import Any

from sandforge.runtime.providers.chat import ScriptedChatProvider
from sandforge.runtime.sessions import (
    Session,
    SessionStore,
    StaticGroupSource,
    ToolGroup,
    ToolRegistry,
    ToolResult,
    ToolSpec,
)

QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
ID_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}

GMAIL = ToolGroup(
    name="google_gmail",
    description="Read, search and trash Gmail messages.",
    role="gmail",
    tools=(
        ToolSpec(name="gmail_search", description="Search mail.", input_schema=QUERY_SCHEMA, method="search"),
        ToolSpec(name="gmail_trash", description="Trash one message.", input_schema=ID_SCHEMA, method="trash"),
    ),
)
DRIVE = ToolGroup(
    name="google_drive",
    description="Files in Google Drive.",
    tools=(ToolSpec(name="drive_list", description="List files."),),
)
CALENDAR = ToolGroup(
    name="calendar",
    description="Calendar events.",
    tools=(ToolSpec(name="calendar_today", description="Today's events."),),
)
ALL_GROUPS = (GMAIL, DRIVE, CALENDAR)
CORE = ["load_tool_group", "list_tool_groups"]


def registry(*groups: ToolGroup) -> ToolRegistry:
    return ToolRegistry(StaticGroupSource(groups or ALL_GROUPS))


class RecordingRunner:
    """A ToolRunner that answers every call with ok and records (role, method, input)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def run(self, group: ToolGroup, tool: ToolSpec, tool_input: dict[str, Any]) -> ToolResult:
        with self._lock:
            self.calls.append((group.agent_role, tool.method_name, dict(tool_input)))
        return ToolResult(ok=True, content=f"{tool.name} ok")


def load(group: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "load_tool_group", "input": {"group_name": group}}]}


def call(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": tool_input}]}


def make_session(
    store: SessionStore,
    turns: list[Any],
    *,
    restore_groups: bool = True,
    reg: ToolRegistry | None = None,
    runner: Any = None,
    session_id: str | None = None,
) -> tuple[Session, ScriptedChatProvider]:
    provider = ScriptedChatProvider(turns)
    options: dict[str, Any] = {
        "provider": provider,
        "registry": reg or registry(),
        "runner": runner if runner is not None else RecordingRunner(),
        "restore_groups": restore_groups,
    }
    if session_id is None:
        return Session.create(store, **options), provider
    return Session.open(store, session_id, **options), provider
