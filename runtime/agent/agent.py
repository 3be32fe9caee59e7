"""Agent: a role whose methods are written by a model on first call.

    calc = Agent.for_role("calculator", provider=ScriptedProvider([...]))
    outcome = calc.call("add", 3)   # explicit: generate -> validate -> execute -> commit
    calc.context["memory"]          # explicit: reads the committed context, no model call
    calc.memory = 0                 # dynamic: writes context, no model call
    outcome = calc.add(3)           # dynamic: the same call as calc.call("add", 3)

Any public attribute that is not a context key is a method; calling it returns an :class:`Outcome`. An
uncalled one (``calc.totl``, a typo for a context key) is a :class:`MethodProxy`: printing it says so, and
comparing it or testing its truth raises TypeError naming the keys there are, so a typo cannot pass as a
value. The only reserved names are ``role``, ``context``, ``workspace`` and ``call`` (use
``agent.call("call", ...)`` for a method of that name). ``runtime/agent/aio.py`` is the async twin.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import JsonValue

from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.source import ProgramStore
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.agent.workspace import FileInputs, LogSpec, Workspace
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.providers.base import Provider
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Limits, Sandbox, SandboxConfig
from sandforge.sandbox.config import BackendName

RESERVED = frozenset({"role", "context", "workspace", "call", "call_with_files"})


class ContextAttributes:
    """The dynamic attribute API, shared by :class:`Agent` and the async ``AsyncAgent``: a public attribute
    reads (and assignment writes) the role's committed context; any other is a method (``_method``)."""

    __slots__ = ()
    _role: str
    _workspace: Workspace
    RESERVED: ClassVar[frozenset[str]] = RESERVED

    @property
    def role(self) -> str:
        return self._role

    @property
    def context(self) -> dict[str, JsonValue]:
        """A copy of the committed context."""
        return self._workspace.context(self._role)

    def _method(self, name: str) -> MethodProxy:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        context = self._workspace.context(self._role)
        if name in context:
            return context[name]
        return self._method(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in self.RESERVED:
            raise AttributeError(f"{name!r} is reserved on an agent; use agent.workspace.update_context")
        self._workspace.update_context(self._role, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("_") or name in self.RESERVED:
            raise AttributeError(name)
        try:
            self._workspace.delete_context(self._role, name)
        except KeyError:
            raise AttributeError(name) from None


class Agent(ContextAttributes):
    __slots__ = ("_role", "_workspace")

    def __init__(self) -> None:
        raise TypeError("use Agent.for_role(role, provider=...) or Agent.for_role(role, workspace=...)")

    @classmethod
    def _bind(cls, workspace: Workspace, role: str) -> Agent:
        if not isinstance(role, str) or not role.strip():
            raise ValueError("a role is a non-empty string")
        agent = object.__new__(cls)
        object.__setattr__(agent, "_role", role)
        object.__setattr__(agent, "_workspace", workspace)
        return agent

    @classmethod
    def for_role(
        cls,
        role: str,
        *,
        provider: Provider | None = None,
        sandbox: Sandbox | SandboxConfig | BackendName | None = None,
        store: ProgramStore | ToolStore | None = None,
        log: LogSpec = None,
        policy: Policy | None = None,
        context: dict[str, JsonValue] | None = None,
        backend: BackendName | None = None,
        limits: Limits | None = None,
        workspace: Workspace | None = None,
        trace_budget: TraceBudget | None = None,
        **budgets: int,
    ) -> Agent:
        """An agent for ``role`` in a new workspace (or in ``workspace``, sharing its runtime: its context
        lives there, so two agents for one role in one workspace share it). ``context`` replaces the role's
        committed context.

        ``budgets``: ``generation_retry_budget``, ``guardrail_recovery_budget``, ``execution_repair_budget``,
        ``fresh_outcome_repair_budget``, ``max_depth`` (see :class:`Budgets`). ``trace_budget``: what one
        call may spend with all its nested calls (see :class:`TraceBudget`; default from the environment).
        """
        if workspace is None:
            if provider is None:
                raise TypeError("Agent.for_role needs provider= (or workspace=)")
            workspace = Workspace(
                provider=provider, sandbox=sandbox, backend=backend, policy=policy, log=log, store=store,
                limits=limits, budgets=Budgets.from_kwargs(budgets), trace_budget=trace_budget,
            )  # fmt: skip
        elif budgets or trace_budget is not None:
            raise TypeError("budgets belong to the workspace; pass them when creating it")
        if context is not None:
            workspace.set_context(role, context)
        return cls._bind(workspace, role)

    # --- reserved API ---

    @property
    def workspace(self) -> Workspace:
        return self._workspace

    def call(self, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """The dynamic call ``method(*args, **kwargs)``, for any method name."""
        return self._workspace.call(self._role, method, *args, **kwargs)

    def call_with_files(self, method: str, files: FileInputs, /, *args: Any, **kwargs: Any) -> Outcome:
        """:meth:`call` with input files; the outputs of the attempt that succeeded are ``Outcome.files``
        (:meth:`Workspace.call_with_files`)."""
        return self._workspace.call_with_files(self._role, method, files, *args, **kwargs)

    def _method(self, name: str) -> MethodProxy:
        return _DynamicMethod(self, name)

    def __repr__(self) -> str:
        return f"<Agent {self._role!r}>"

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self._workspace.close()


class MethodProxy:
    """``agent.add`` before it is called. It is not a value: printed, it says what it is; compared, or tested
    for truth, it raises TypeError (``calc.totl == 15`` is a typo of ``calc.total``, never just False)."""

    __slots__ = ("_agent", "_name")

    def __init__(self, agent: ContextAttributes, name: str) -> None:
        self._agent, self._name = agent, name

    def _what(self) -> str:
        keys = sorted(self._agent.context)
        near = difflib.get_close_matches(self._name, keys, n=1)
        hint = f"; did you mean the context key {near[0]!r}?" if near else ""
        listed = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "") if keys else "none"
        return (
            f"{self._agent.role}.{self._name} is an uncalled method (call it: agent.call({self._name!r}, ...)), "
            f"not a context value: the context has no key {self._name!r} (its keys: {listed}){hint}"
        )

    def __repr__(self) -> str:
        return f"<{self._what()}>"

    def _refuse(self, *_: object) -> bool:
        raise TypeError(self._what())

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __bool__ = _refuse
    __hash__ = None  # type: ignore[assignment]


class _DynamicMethod(MethodProxy):
    """``agent.add``: calling it makes the dynamic call."""

    __slots__ = ()
    _agent: Agent

    def __call__(self, *args: Any, **kwargs: Any) -> Outcome:
        return self._agent.call(self._name, *args, **kwargs)


DynamicMethod = Callable[..., Outcome]
