"""The lifecycle's port: what one call may use (:class:`CallEnv`) and what the call is (:class:`CallSpec`).

The call loop (``runtime.agent.lifecycle``) sees nothing of the workspace but this: a small immutable
environment made once per top-level call and shared by its nested calls. So the lifecycle never reaches
into a workspace's private state, and a test can run it on any sandbox, store and record sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import JsonValue

from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.ids import new_id
from sandforge.runtime.agent.source import ProgramStore
from sandforge.runtime.agent.state import StagedRecord, State
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.gate import SandboxPort
from sandforge.runtime.guardrails import Policy
from sandforge.runtime.providers.base import Provider
from sandforge.sandbox import Limits
from sandforge.sandbox.config import BackendName

if TYPE_CHECKING:
    from sandforge.runtime.agent.environment import Environments
    from sandforge.runtime.egress.broker import EgressBroker

#: Where the records of committed top-level calls go (the store's hook first, then the call log).
RecordSink = Callable[[list[StagedRecord]], None]


@dataclass(frozen=True)
class CallEnv:
    """Everything a call may use, fixed for the call: who writes programs, what may run, where, how much."""

    provider: Provider
    provider_name: str
    policy: Policy
    sandbox: SandboxPort
    backend: BackendName | None
    limits: Limits
    budgets: Budgets
    trace_budget: TraceBudget
    store: ProgramStore | None
    #: the committed contexts and tool registry every attempt's transaction reads through to
    state: State
    records: RecordSink
    #: the broker its executions fetch through (None: the policy's own, ``runtime.agent.egress.broker_for``);
    #: a policy that does not grant ``http_fetch`` reaches nothing either way
    egress: EgressBroker | None = None
    #: where programs' environments are prepared (issue 19; None: ``<state dir>/environments``)
    environments: Environments | None = None


@dataclass(frozen=True)
class CallSpec:
    """One logical call: ``role.method(*args, **kwargs)`` at ``depth`` of trace ``trace_id``."""

    role: str
    method: str
    args: list[JsonValue]
    kwargs: dict[str, JsonValue]
    depth: int = 0
    trace_id: str = field(default_factory=new_id)
    parent_call_id: str | None = None
    call_id: str = field(default_factory=new_id)
    #: when the execution that made this nested call runs out of time (None at the top level)
    call_deadline: float | None = None
    #: the call's input files (``inputs/NAME`` to each attempt's program, checked against the limits before
    #: the call starts); a nested call gets only those its caller handed it (``call_with_files``: docs/files.md)
    files: dict[str, bytes] = field(default_factory=dict)
    #: the outputs of the attempt that commits come back on the Outcome: a top-level call's always, a nested
    #: call's only when its caller asked (``call_with_files``); otherwise they end with the sandbox
    returns_files: bool = False
