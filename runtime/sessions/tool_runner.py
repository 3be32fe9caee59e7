"""The session's tool runners: how a group tool runs, as a method call on the Agent for the group's role
(generate or reuse a tool program, validate it, execute it in a disposable sandbox; ADR 0016), its Outcome
turned into a tool result.

What a runner calls is typed: a :class:`ToolAgent` (``call(method, *args, **kwargs)``, which
``runtime.agent.Agent`` is) answering a :class:`ToolOutcome` (which ``runtime.agent.Outcome`` is).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.sessions.groups import ToolGroup, ToolSpec

if TYPE_CHECKING:
    from sandforge.runtime.agent import ProgramStore, Workspace
    from sandforge.runtime.agent.workspace import LogSpec
    from sandforge.runtime.guardrails import Policy
    from sandforge.runtime.providers.base import Provider
    from sandforge.runtime.store import ToolStore
    from sandforge.sandbox import Sandbox, SandboxConfig
    from sandforge.sandbox.config import BackendName

log = logging.getLogger(__name__)

RESULT_MAX_CHARS = 20_000


class ToolResult(BaseModel):
    """What the model gets back for one tool call (``content``), plus host-side ``metadata`` (persisted,
    never sent to the model)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    content: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def error(cls, message: str, **metadata: Any) -> ToolResult:
        return cls(ok=False, content=message, metadata=metadata)


class ToolRunner(Protocol):
    """Runs one tool of a loaded group. Must not raise for anything the tool does."""

    def run(self, group: ToolGroup, tool: ToolSpec, tool_input: dict[str, Any]) -> ToolResult: ...


class ToolOutcome(Protocol):
    """What a runner reads of one call's answer (``runtime.agent.Outcome`` is one)."""

    @property
    def status(self) -> str: ...
    @property
    def value(self) -> JsonValue: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def retriable(self) -> bool: ...
    @property
    def tool_role(self) -> str: ...
    @property
    def method_name(self) -> str: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


class ToolAgent(Protocol):
    """What :class:`AgentToolRunner` calls for a group's role (``runtime.agent.Agent`` is one): the dynamic
    call ``method(*args, **kwargs)`` for any method name. It answers tool failures with error outcomes."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> ToolOutcome: ...


AgentFactory = Callable[[str], ToolAgent]


def split_input(tool: ToolSpec, tool_input: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The call's positional and keyword arguments, per the tool's ``arguments`` convention."""
    if tool.arguments == "args_kwargs":
        args = tool_input.get("args") or []
        kwargs = tool_input.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError("'args' must be an array and 'kwargs' an object")
        return list(args), dict(kwargs)
    return [], dict(tool_input)


def _bounded(text: str) -> str:
    if len(text) <= RESULT_MAX_CHARS:
        return text
    return text[:RESULT_MAX_CHARS] + f"... [truncated, {len(text)} characters]"


#: At most this many sources are named to the model after a result (all of them stay in the metadata).
MAX_SOURCES_SHOWN = 10


def sources_text(records: Any) -> str:
    """The requests the tool's program had the host make (issue 18), as lines the model reads after the
    result: written by the host from the broker's records, so fetched data always comes with its sources."""
    if not isinstance(records, list) or not records:
        return ""
    lines = []
    for record in records[:MAX_SOURCES_SHOWN]:
        if not isinstance(record, Mapping):
            continue
        where = str(record.get("final_url") or record.get("url") or "")[:300]
        status = record.get("status") if record.get("error") is None else record.get("error")
        lines.append(f"- {str(record.get('method') or '')[:16]} {where} -> {status}")
    more = f"\n- (+{len(records) - MAX_SOURCES_SHOWN} more)" if len(records) > MAX_SOURCES_SHOWN else ""
    return "\n\nsources (requests made by the host for this result):\n" + "\n".join(lines) + more


def all_sources(meta: Mapping[str, Any]) -> list[Any]:
    """The call's own requests, then those of the nested calls it made (each entry has its records)."""
    own = meta.get("egress")
    found = list(own) if isinstance(own, list) else []
    nested = meta.get("egress_nested")
    for entry in nested if isinstance(nested, list) else []:
        records = entry.get("egress") if isinstance(entry, Mapping) else None
        found.extend(records if isinstance(records, list) else [])
    return found


def outcome_to_result(outcome: ToolOutcome) -> ToolResult:
    """An Agent ``Outcome`` as a tool result. Only the value or the user-facing error reaches the model,
    followed by its sources when the program fetched; attempt diagnostics stay in the metadata."""
    meta: dict[str, Any] = {
        "error_type": _str(outcome.error_type),
        "retriable": bool(outcome.retriable),
        "tool_role": outcome.tool_role,
        "method_name": outcome.method_name,
    }
    outcome_meta = outcome.metadata
    if isinstance(outcome_meta, Mapping):
        keep = ("artifact_hit", "program_source", "call_id", "trace_id", "attempts", "backend", "duration_s")
        meta.update({k: outcome_meta[k] for k in keep if k in outcome_meta})
        meta.update({k: outcome_meta[k] for k in ("egress", "egress_nested") if outcome_meta.get(k)})
    meta = {k: v for k, v in meta.items() if v is not None}
    sources = sources_text(all_sources(meta))
    if _str(outcome.status) == "ok":
        value = outcome.value
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
        return ToolResult(ok=True, content=_bounded(text) + sources, metadata=meta)
    retriable = " (retriable)" if meta.get("retriable") else ""
    message = outcome.error_message or "the tool failed"
    content = _bounded(f"{meta.get('error_type', 'error')}{retriable}: {message}") + sources
    return ToolResult(ok=False, content=content, metadata=meta)


def _str(value: str | None) -> str | None:
    """The text of a status or error type (an enumeration member gives its value)."""
    if value is None:
        return None
    return str(value.value) if isinstance(value, Enum) else str(value)


class UnavailableRunner:
    """A runner for sessions that cannot run group tools (no program provider configured): every call is an
    error tool result saying why, so the conversation goes on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def run(self, group: ToolGroup, tool: ToolSpec, tool_input: dict[str, Any]) -> ToolResult:
        return ToolResult.error(f"tool '{tool.name}' cannot run: {self.reason}")


class AgentToolRunner:
    """Runs group tools through ``runtime.agent``: ``agent.call(method, *args, **kwargs)`` on the Agent
    for the group's role. All roles share one Workspace (provider, sandbox, policy, call log, program store):
    ``workspace`` when given, else one made from ``provider``, ``sandbox``, ``store``, ``log`` and
    ``budgets`` (and ``policy``, whose egress section brokers the tools' fetches); each agent is
    ``Agent.for_role(role, workspace=...)``. Agents are cached per role, so a role's context carries over
    between calls and turns of the process.

    ``agent_factory(role)`` replaces all of that (tests, custom wiring).
    """

    def __init__(
        self,
        *,
        provider: Provider | None = None,
        sandbox: Sandbox | SandboxConfig | BackendName | None = None,
        store: ProgramStore | ToolStore | None = None,
        log: LogSpec = None,
        workspace: Workspace | None = None,
        agent_factory: AgentFactory | None = None,
        policy: Policy | None = None,
        **budgets: int,
    ) -> None:
        self.provider = provider
        self.policy = policy  # what the tools' programs may do, fetches included (None: the default policy)
        self.sandbox = sandbox
        self.store = store
        self.log = log
        self.budgets = budgets
        self.workspace = workspace
        self._owns_workspace = False
        self._factory = agent_factory or self._default_factory
        self._agents: dict[str, ToolAgent] = {}
        self._lock = threading.Lock()

    def _default_factory(self, role: str) -> ToolAgent:
        from sandforge.runtime.agent import Agent, Budgets, Workspace  # the agent layer only when a tool runs

        if self.workspace is None:
            self.workspace = Workspace(
                # without a provider only stored programs run; a call that needs a new one gets an error outcome
                provider=cast("Provider", self.provider),
                sandbox=self.sandbox,
                store=self.store,
                log=self.log,
                budgets=Budgets.from_kwargs(self.budgets),
                policy=self.policy,
            )
            self._owns_workspace = True
        return Agent.for_role(role, workspace=self.workspace)

    def agent(self, role: str) -> ToolAgent:
        """The (cached) Agent for ``role``."""
        with self._lock:
            agent = self._agents.get(role)
            if agent is None:
                agent = self._agents[role] = self._factory(role)
            return agent

    def run(self, group: ToolGroup, tool: ToolSpec, tool_input: dict[str, Any]) -> ToolResult:
        try:
            args, kwargs = split_input(tool, tool_input)
        except ValueError as exc:
            return ToolResult.error(f"invalid input for tool '{tool.name}': {exc}")
        try:
            agent = self.agent(group.agent_role)
            outcome = agent.call(tool.method_name, *args, **kwargs)
        except SandforgeError as exc:
            return ToolResult.error(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the Agent promises Outcomes; anything else must not kill the chat
            log.exception("tool %s (role %s, method %s) raised", tool.name, group.agent_role, tool.method_name)
            return ToolResult.error(f"internal error while running '{tool.name}': {type(exc).__name__}: {exc}")
        return outcome_to_result(outcome)

    def close(self) -> None:
        """Close the workspace this runner created (a Sandbox passed in stays open: its owner closes it)."""
        with self._lock:
            if self._owns_workspace and self.workspace is not None:
                self.workspace.close()
            self._agents.clear()
