"""The async agent API: ``await agent.call("add", 3)`` (or ``await agent.add(3)``) on the sync lifecycle.

    async with AsyncAgent.for_role("calculator", provider=provider) as calc:
        outcome = await calc.call("add", 3)
        calc.context["total"]

There is one lifecycle (``runtime/agent/lifecycle.py``). An awaited call runs it on a thread of its workspace
(one at a time: a workspace serialises its calls, and waiting for the turn holds no thread), and each of its
executions, nested ones included, is awaited on the event loop (``runtime/agent/awaited.py``: an
``AsyncSandbox`` on the workspace's sandbox; no thread waits on a sandbox). Generating a program (the
provider) and validating it stay on that thread.

Cancelling the awaiting task cancels the execution in flight (its worker is killed and cleaned up as after a
timeout), stops every later one, and the call unwinds with nothing committed (``runtime/agent/awaited.py``);
the task then gets ``CancelledError``. A cancellation that arrives while the call is already committing comes
too late for that commit: it stays, and the task still gets ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypedDict, Unpack

from pydantic import JsonValue

from sandforge.runtime.agent.agent import RESERVED, Agent, ContextAttributes, MethodProxy
from sandforge.runtime.agent.awaited import InFlight, run_awaited
from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.source import ProgramStore
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.agent.workspace import FileInputs, LogSpec, Workspace
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.providers.base import Provider
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import AsyncSandbox, Limits, Sandbox
from sandforge.sandbox.config import BackendName, SandboxConfig


class AgentOptions(TypedDict, total=False):
    """What :meth:`AsyncAgent.for_role` passes to its new workspace (as :meth:`Agent.for_role` does)."""

    provider: Provider
    sandbox: AsyncSandbox | Sandbox | SandboxConfig | BackendName | None
    store: ProgramStore | ToolStore | None
    log: LogSpec
    policy: Policy | None
    backend: BackendName | None
    limits: Limits | None
    trace_budget: TraceBudget | None
    generation_retry_budget: int
    guardrail_recovery_budget: int
    execution_repair_budget: int
    fresh_outcome_repair_budget: int
    max_depth: int


#: The options of AgentOptions that are the workspace's own (the rest are its budgets).
_WORKSPACE_OPTIONS = frozenset({"store", "log", "policy", "backend", "limits", "trace_budget"})


class AsyncWorkspace:
    """A :class:`Workspace` for asyncio: the same runtime (sandbox, provider, policy, state, log), its calls
    awaited. Given an ``AsyncSandbox`` it shares it (its owner closes it); otherwise the workspace's own
    sandbox is used and closed with it."""

    def __init__(self, workspace: Workspace, sandbox: AsyncSandbox | None = None) -> None:
        self.workspace = workspace
        self.sandbox = sandbox if sandbox is not None else AsyncSandbox(workspace.sandbox)
        self._owns_async = sandbox is None
        self._turn = asyncio.Lock()  # calls are serialised, as in the workspace: waiting holds no thread
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandforge-call")
        self._calls = InFlight()  # closing cancels the calls still running (they would hold the close up)

    @classmethod
    def create(
        cls,
        *,
        provider: Provider,
        sandbox: AsyncSandbox | Sandbox | SandboxConfig | BackendName | None = None,
        **options: Any,
    ) -> AsyncWorkspace:
        """A new workspace (``options`` as :class:`Workspace` takes them) on ``sandbox``."""
        shared = sandbox if isinstance(sandbox, AsyncSandbox) else None
        inner = shared.sandbox if shared is not None else sandbox
        assert not isinstance(inner, AsyncSandbox)
        return cls(Workspace(provider=provider, sandbox=inner, **options), shared)

    async def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """``Workspace.call``, awaited (see the module's docstring for cancellation)."""
        call = functools.partial(self.workspace.call, role, method, *args, **kwargs)
        async with self._turn:
            return await run_awaited(call, thread=self._thread, threads=self.sandbox.threads, calls=self._calls)

    async def call_with_files(self, role: str, method: str, files: FileInputs, /, *args: Any,
                              **kwargs: Any) -> Outcome:  # fmt: skip
        """``Workspace.call_with_files``, awaited."""
        call = functools.partial(self.workspace.call_with_files, role, method, files, *args, **kwargs)
        async with self._turn:
            return await run_awaited(call, thread=self._thread, threads=self.sandbox.threads, calls=self._calls)

    def context(self, role: str) -> dict[str, JsonValue]:
        return self.workspace.context(role)

    async def aclose(self) -> None:
        """Close the workspace (and what it owns) off the loop. Calls still running are cancelled first (their
        tasks get CancelledError, nothing of them is committed); later calls raise CallsClosed."""
        self._calls.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self.workspace.close)
        if self._owns_async:
            await self.sandbox.aclose()
        self._thread.shutdown(wait=False)

    async def __aenter__(self) -> AsyncWorkspace:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncAgent(ContextAttributes):
    """:class:`Agent` for asyncio: ``await agent.call("add", 3)``, ``await agent.add(3)``; the context is
    read and written as on an Agent (``agent.context["total"]``, ``agent.total = 1``: no model call, no await)."""

    __slots__ = ("_async", "_role", "_workspace")
    _async: AsyncWorkspace
    RESERVED: ClassVar[frozenset[str]] = RESERVED | {"aclose"}

    def __init__(self) -> None:
        raise TypeError("use AsyncAgent.for_role(role, provider=...) or AsyncAgent.for_role(role, workspace=...)")

    @classmethod
    def for_role(
        cls,
        role: str,
        *,
        workspace: AsyncWorkspace | None = None,
        context: dict[str, JsonValue] | None = None,
        **options: Unpack[AgentOptions],
    ) -> AsyncAgent:
        """As :meth:`Agent.for_role` (the same keyword options, typed: :class:`AgentOptions`); ``sandbox`` may
        also be an ``AsyncSandbox`` (shared, not closed here)."""
        if workspace is None:
            provider = options.get("provider")
            if provider is None:
                raise TypeError("AsyncAgent.for_role needs provider= (or workspace=)")
            sandbox = options.get("sandbox")
            settings: dict[str, Any] = {k: v for k, v in options.items() if k in _WORKSPACE_OPTIONS}
            budgets = {k: v for k, v in options.items() if k not in _WORKSPACE_OPTIONS | {"provider", "sandbox"}}
            workspace = AsyncWorkspace.create(
                provider=provider, sandbox=sandbox, budgets=Budgets.from_kwargs(budgets), **settings
            )
        elif options:
            raise TypeError("a workspace's options (provider, sandbox, budgets, ...) belong to the workspace")
        sync = Agent.for_role(role, workspace=workspace.workspace, context=context)
        agent = object.__new__(cls)
        object.__setattr__(agent, "_role", sync.role)
        object.__setattr__(agent, "_workspace", workspace.workspace)
        object.__setattr__(agent, "_async", workspace)
        return agent

    @property
    def workspace(self) -> AsyncWorkspace:
        return self._async

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """The dynamic call ``method(*args, **kwargs)``, awaited, for any method name."""
        return await self._async.call(self._role, method, *args, **kwargs)

    async def call_with_files(self, method: str, files: FileInputs, /, *args: Any, **kwargs: Any) -> Outcome:
        """``Agent.call_with_files``, awaited."""
        return await self._async.call_with_files(self._role, method, files, *args, **kwargs)

    def _method(self, name: str) -> MethodProxy:
        return _AsyncMethod(self, name)

    def __repr__(self) -> str:
        return f"<AsyncAgent {self._role!r}>"

    async def aclose(self) -> None:
        await self._async.aclose()

    async def __aenter__(self) -> AsyncAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _AsyncMethod(MethodProxy):
    """``agent.add`` on an AsyncAgent: ``await agent.add(3)`` makes the call."""

    __slots__ = ()
    _agent: AsyncAgent

    async def __call__(self, *args: Any, **kwargs: Any) -> Outcome:
        return await self._agent.call(self._name, *args, **kwargs)


__all__ = ["AgentOptions", "AsyncAgent", "AsyncWorkspace"]
