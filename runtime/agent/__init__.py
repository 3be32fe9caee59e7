"""Agent API and the generation lifecycle (ADR 0016): generate -> validate -> execute -> commit.

    from sandforge.runtime.agent import Agent
    from sandforge.runtime.providers import ScriptedProvider

    calc = Agent.for_role("calculator", provider=ScriptedProvider(["context['m'] = args[0]\\nreturn args[0]"]))
    calc.add(3)          # Outcome(status='ok', value=3, ...)
    calc.m               # 3

See docs/lifecycle.md for the lanes, budgets, transactions and the call log.
"""

from __future__ import annotations

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
