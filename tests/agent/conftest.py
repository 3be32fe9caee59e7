"""Fixtures for lifecycle tests: a workspace on the backend under test, fed by a scripted provider."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from sandforge.runtime.agent import Budgets, CallLog, CallRecord, Workspace
from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.scripted import ScriptItem
from sandforge.sandbox import Limits, Sandbox

#: Breaks a recoverable rule of the default policy (RECOVERABLE_RULE); it would write context if it ran.
RECOVERABLE = "import os\ncontext['cwd'] = os.getcwd()\nreturn 1\n"
RECOVERABLE_RULE = "forbidden_module"
#: Breaks a terminal rule of the default policy (a capability the policy does not grant).
TERMINAL = "import socket\ns = socket.socket()\nreturn 1\n"

MakeWorkspace = Callable[..., tuple[Workspace, ScriptedProvider]]


def verdict(code: str) -> str:
    return validate(code, default_policy()).verdict


@pytest.fixture(scope="session")
def policy_fixtures_hold() -> None:
    """The lifecycle tests rely on these two programs' verdicts; fail loudly if the policy changes."""
    result = validate(RECOVERABLE, default_policy())
    assert result.verdict == "recoverable", result
    assert [v.violation_type for v in result.violations] == [RECOVERABLE_RULE], result
    assert verdict(TERMINAL) == "terminal", validate(TERMINAL, default_policy())


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
def make_ws(sandbox: Sandbox, log_path: Path, policy_fixtures_hold: None) -> Iterator[MakeWorkspace]:
    """Workspaces on the backend under test, sharing the worker's Sandbox of that backend (``sandbox``)."""
    created: list[Workspace] = []

    def factory(
        programs: Sequence[ScriptItem], *, limits: Limits | None = None, **budgets: int
    ) -> tuple[Workspace, ScriptedProvider]:
        provider = ScriptedProvider(programs)
        ws = Workspace(
            provider=provider,
            sandbox=sandbox,
            log=CallLog(log_path),
            budgets=Budgets(**budgets),
            limits=limits,
        )
        created.append(ws)
        return ws, provider

    yield factory
    for ws in created:
        ws.close()


def records(ws: Workspace) -> list[CallRecord]:
    return ws.log.records


def top(ws: Workspace) -> CallRecord:
    """The record of the latest top-level call."""
    return [r for r in ws.log.records if r.depth == 0][-1]
