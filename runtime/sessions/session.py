"""A chat session: the tool-use loop over a persisted history, with tool groups restored from it (RFC-044).

    store = SessionStore()                           # <state dir>/sessions.db
    session = Session.create(store, provider=AnthropicChatProvider(), registry=ToolRegistry(groups),
                             runner=AgentToolRunner(provider=..., sandbox=...))
    result = session.send("delete the spam")         # TurnResult: text, tool calls, active groups

Every ``send`` starts from the core tools, re-activates the groups that earlier turns loaded successfully
(scanning the history it already reads for the transcript: no extra query, no extra model call), then
loops: call the model with the active tools, run each tool call (core tools here, group tools through the
runner, i.e. the Agent lifecycle and the sandbox), persist the response and the results, and send the results
back, until the model answers without tool calls.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.providers.chat import ChatProvider, ChatRequest, ChatResponse, ToolUseBlock
from sandforge.runtime.sessions.db import SessionStore
from sandforge.runtime.sessions.groups import LIST_TOOL_GROUPS, LOAD_TOOL_GROUP, ToolGroup, ToolRegistry, ToolSpec
from sandforge.runtime.sessions.history import restore_loaded_groups, to_api_messages
from sandforge.runtime.sessions.models import Message, SessionInfo, ToolStatus
from sandforge.runtime.sessions.tool_runner import ToolResult, ToolRunner

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are the sandforge assistant. You act through tools. A few core tools are always available; "
    "the others are organized in groups that you load on demand with load_tool_group(group_name). "
    "A loaded group stays available for the rest of the conversation: do not load it again."
)
GROUPS_IN_PROMPT = 50
DESCRIPTION_IN_PROMPT = 160


def not_available(tool_name: str) -> str:
    """The RFC-044 error text for a call to a tool that is not active."""
    return f"Tool '{tool_name}' is not available for this agent"


class ToolCallRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    call_id: str
    name: str
    input: dict[str, Any]
    status: ToolStatus
    content: str


class TurnResult(BaseModel):
    """What one ``send`` did."""

    session_id: str
    text: str = ""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    restored_groups: list[str] = Field(default_factory=list)
    active_groups: list[str] = Field(default_factory=list)
    model_calls: int = 0
    stop_reason: str | None = None
    messages: list[Message] = Field(default_factory=list)


class Session:
    """One conversation. Not for concurrent ``send`` from several threads (calls are serialized); use one
    Session object per conversation and thread, as many as you like on one SessionStore."""

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        *,
        provider: ChatProvider,
        registry: ToolRegistry | None = None,
        runner: ToolRunner | None = None,
        restore_groups: bool = True,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_model_calls: int = 25,
        max_tokens: int = 4096,
    ) -> None:
        self.store = store
        self.id = session_id
        self.provider = provider
        self.registry = registry or ToolRegistry()
        self.runner = runner
        self.restore_groups = restore_groups
        self.system_prompt = system_prompt
        self.max_model_calls = max_model_calls
        self.max_tokens = max_tokens
        self._lock = threading.RLock()
        self._active: dict[str, tuple[ToolSpec, ToolGroup | None]] = {}
        self._loaded: dict[str, ToolGroup | None] = {}  # group name -> group (None: no longer exists)
        self._ready = False

    # --- construction -----------------------------------------------------------------------------------

    @classmethod
    def create(cls, store: SessionStore, *, title: str = "", **options: Any) -> Session:
        return cls(store, store.create_session(title=title).id, **options)

    @classmethod
    def open(cls, store: SessionStore, session_id: str, **options: Any) -> Session:
        """An existing session (exact id or unique prefix); SessionNotFoundError otherwise."""
        return cls(store, store.resolve_id(session_id), **options)

    def _options(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "registry": self.registry,
            "runner": self.runner,
            "restore_groups": self.restore_groups,
            "system_prompt": self.system_prompt,
            "max_model_calls": self.max_model_calls,
            "max_tokens": self.max_tokens,
        }

    def clear(self) -> Session:
        """`/clear`: a new, empty session (recording this one as its predecessor); it starts with core tools."""
        info = self.store.create_session(cleared_from=self.id)
        return Session(self.store, info.id, **self._options())

    @property
    def info(self) -> SessionInfo:
        return self.store.get_session(self.id)

    def history(self) -> list[Message]:
        return self.store.messages(self.id)

    # --- tool state -------------------------------------------------------------------------------------

    def _reset_tools(self, history: Sequence[Message]) -> list[str]:
        """Core tools, plus (RFC-044) the groups that earlier turns loaded successfully."""
        self._active = {t.name: (t, None) for t in self.registry.core_tools()}
        self._loaded = {}
        restored = restore_loaded_groups(history) if self.restore_groups else []
        for name in restored:
            self._activate(name, self.registry.get_group(name))
        self._ready = True
        return restored

    def _activate(self, name: str, group: ToolGroup | None) -> list[str]:
        """Make a group's tools active; returns the names of tools skipped because the name was taken."""
        self._loaded[name] = group
        skipped: list[str] = []
        for tool in group.tools if group else ():
            current = self._active.get(tool.name)
            if current is not None and current[1] is not group:
                skipped.append(tool.name)
                continue
            self._active[tool.name] = (tool, group)
        if group is None:
            log.info("session %s: group %r from history no longer exists; ignored", self.id, name)
        elif skipped:
            log.warning("session %s: group %r: tool name(s) already taken: %s", self.id, name, skipped)
        return skipped

    def active_groups(self) -> list[str]:
        """Groups whose tools are active now (before the first send: what the next send will restore)."""
        with self._lock:
            if not self._ready:
                self._reset_tools(self.history())
            return [n for n, g in self._loaded.items() if g is not None]

    # --- the loop ---------------------------------------------------------------------------------------

    def _system(self) -> str:
        names = self.registry.group_names()
        if not names:
            return self.system_prompt
        lines = [self.system_prompt, "", "Tool groups you can load:"]
        for name in names[:GROUPS_IN_PROMPT]:
            group = self.registry.get_group(name)
            desc = " ".join((group.description if group else "").split())[:DESCRIPTION_IN_PROMPT]
            lines.append(f"- {name}: {desc}" if desc else f"- {name}")
        if len(names) > GROUPS_IN_PROMPT:
            lines.append(f"({len(names) - GROUPS_IN_PROMPT} more: call list_tool_groups)")
        return "\n".join(lines)

    def send(self, text: str) -> TurnResult:
        """One user turn: restore groups, then model <-> tools until the model stops calling tools."""
        with self._lock:
            history = self.store.messages(self.id)  # the snapshot: the transcript and the group scan
            restored = self._reset_tools(history)
            transcript = list(history)
            new = self.store.append([Message.user(self.id, text)])
            transcript += new
            result = TurnResult(session_id=self.id, restored_groups=restored)
            texts: list[str] = []
            for _ in range(self.max_model_calls):
                request = ChatRequest(
                    system=self._system(),
                    messages=to_api_messages(transcript),
                    tools=[spec.api_dict() for spec, _ in self._active.values()],
                    max_tokens=self.max_tokens,
                )
                response = self.provider.complete(request)
                result.model_calls += 1
                result.stop_reason = response.stop_reason
                stored = self.store.append(self._step_messages(response, texts, result))
                transcript += stored
                new += stored
                if not response.tool_uses:
                    break
            else:
                result.stop_reason = "max_model_calls"
                log.warning("session %s: stopped after %d model calls", self.id, self.max_model_calls)
            result.text = "\n".join(texts)
            result.active_groups = [n for n, g in self._loaded.items() if g is not None]
            result.messages = new
            return result

    def _step_messages(self, response: ChatResponse, texts: list[str], result: TurnResult) -> list[Message]:
        """What one model response adds to the history: its text, then its tool calls and their results
        (each tool call run here, in order); the text and the calls are noted in ``texts`` and ``result``."""
        batch: list[Message] = []
        if response.text:
            texts.append(response.text)
            batch.append(
                Message.assistant(
                    self.id,
                    response.text,
                    {"model": response.model, "stop_reason": response.stop_reason, "usage": response.usage},
                )
            )
        calls: list[Message] = []
        results: list[Message] = []
        for use in response.tool_uses:
            outcome = self._execute(use)
            status = ToolStatus.SUCCESS if outcome.ok else ToolStatus.ERROR
            calls.append(
                Message.tool_call(
                    self.id,
                    name=use.name,
                    call_id=use.id,
                    status=status,
                    tool_input=json.dumps(use.input, ensure_ascii=False),
                )
            )
            results.append(
                Message.tool_result(
                    self.id, name=use.name, call_id=use.id, status=status, content=outcome.content,
                    metadata=outcome.metadata,
                )
            )  # fmt: skip
            result.tool_calls.append(
                ToolCallRecord(call_id=use.id, name=use.name, input=use.input, status=status, content=outcome.content)
            )
        return batch + calls + results

    # --- tools ------------------------------------------------------------------------------------------

    def _execute(self, use: ToolUseBlock) -> ToolResult:
        if use.name == LOAD_TOOL_GROUP and use.name in self._active:
            return self._load_tool_group(use.input)
        if use.name == LIST_TOOL_GROUPS and use.name in self._active:
            return self._list_tool_groups()
        entry = self._active.get(use.name)
        if entry is None:
            return ToolResult.error(not_available(use.name))
        spec, group = entry
        if group is None:  # a core tool this session does not implement
            return ToolResult.error(f"core tool '{use.name}' has no implementation")
        missing = [k for k in spec.input_schema.get("required", []) if k not in use.input]
        if missing:
            return ToolResult.error(f"tool '{use.name}' is missing required input: {', '.join(missing)}")
        if self.runner is None:
            return ToolResult.error(f"tool '{use.name}' cannot run: this session has no tool runner")
        return self.runner.run(group, spec, use.input)

    def _load_tool_group(self, tool_input: dict[str, Any]) -> ToolResult:
        name = tool_input.get("group_name")
        if not isinstance(name, str) or not name:
            return ToolResult.error("load_tool_group needs a non-empty 'group_name' string")
        group = self.registry.get_group(name)
        if group is None:
            available = ", ".join(self.registry.group_names()) or "none"
            return ToolResult.error(f"Unknown tool group '{name}'. Available groups: {available}")
        tools = ", ".join(t.name for t in group.tools) or "(no tools)"
        if self._loaded.get(name) is group:
            return ToolResult(ok=True, content=f"Tool group '{name}' is already loaded: {tools}")
        skipped = self._activate(name, group)
        note = f" (not loaded, name already in use: {', '.join(skipped)})" if skipped else ""
        return ToolResult(ok=True, content=f"Loaded tool group '{name}': {tools}{note}")

    def _list_tool_groups(self) -> ToolResult:
        lines = []
        for name in self.registry.group_names():
            group = self.registry.get_group(name)
            if group is None:
                continue
            state = "loaded" if self._loaded.get(name) is group else "not loaded"
            lines.append(f"{name} [{state}]: {group.description} (tools: {', '.join(t.name for t in group.tools)})")
        return ToolResult(ok=True, content="\n".join(lines) or "No tool groups are configured.")
