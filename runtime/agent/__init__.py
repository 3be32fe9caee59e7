"""Agent API and the generation lifecycle (ADR 0016): generate -> validate -> execute -> commit.

    from sandforge.runtime.agent import Agent
    from sandforge.runtime.providers import ScriptedProvider

    calc = Agent.for_role("calculator", provider=ScriptedProvider(["context['m'] = args[0]\\nreturn args[0]"]))
    calc.add(3)          # Outcome(status='ok', value=3, ...)
    calc.m               # 3

See docs/lifecycle.md for the lanes, budgets, transactions and the call log. The names load on first use: a
submodule (``agent.egress``, ``agent.outcome``) imports without the whole agent, store and call log (issue 39).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.agent.agent import Agent, MethodProxy
    from sandforge.runtime.agent.aio import AsyncAgent, AsyncWorkspace
    from sandforge.runtime.agent.budgets import Budgets
    from sandforge.runtime.agent.calllog import (
        AttemptFailure,
        CallLog,
        CallRecord,
        call_log_schema,
        default_log_path,
        read_records,
    )
    from sandforge.runtime.agent.failures import FailureClass, classify_failure
    from sandforge.runtime.agent.lanes import GUARDRAIL_EXHAUSTED_MESSAGE
    from sandforge.runtime.agent.outcome import Outcome
    from sandforge.runtime.agent.source import ProgramCandidate, ProgramStore
    from sandforge.runtime.agent.trace_budget import TraceBudget, TraceUsage
    from sandforge.runtime.agent.workspace import Workspace
    from sandforge.runtime.store.models import ToolContract

__all__ = [
    "GUARDRAIL_EXHAUSTED_MESSAGE",
    "Agent",
    "AsyncAgent",
    "AsyncWorkspace",
    "AttemptFailure",
    "Budgets",
    "CallLog",
    "CallRecord",
    "FailureClass",
    "MethodProxy",
    "Outcome",
    "ProgramCandidate",
    "ProgramStore",
    "ToolContract",
    "TraceBudget",
    "TraceUsage",
    "Workspace",
    "call_log_schema",
    "classify_failure",
    "default_log_path",
    "read_records",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Agent": "sandforge.runtime.agent.agent",
        "MethodProxy": "sandforge.runtime.agent.agent",
        "AsyncAgent": "sandforge.runtime.agent.aio",
        "AsyncWorkspace": "sandforge.runtime.agent.aio",
        "Budgets": "sandforge.runtime.agent.budgets",
        "AttemptFailure": "sandforge.runtime.agent.calllog",
        "CallLog": "sandforge.runtime.agent.calllog",
        "CallRecord": "sandforge.runtime.agent.calllog",
        "call_log_schema": "sandforge.runtime.agent.calllog",
        "default_log_path": "sandforge.runtime.agent.calllog",
        "read_records": "sandforge.runtime.agent.calllog",
        "FailureClass": "sandforge.runtime.agent.failures",
        "classify_failure": "sandforge.runtime.agent.failures",
        "GUARDRAIL_EXHAUSTED_MESSAGE": "sandforge.runtime.agent.lanes",
        "Outcome": "sandforge.runtime.agent.outcome",
        "ProgramCandidate": "sandforge.runtime.agent.source",
        "ProgramStore": "sandforge.runtime.agent.source",
        "TraceBudget": "sandforge.runtime.agent.trace_budget",
        "TraceUsage": "sandforge.runtime.agent.trace_budget",
        "Workspace": "sandforge.runtime.agent.workspace",
        "ToolContract": "sandforge.runtime.store.models",
    },
)
