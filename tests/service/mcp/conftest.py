"""Tenants for the MCP tests: a state directory with proven tools in it, and a policy (real sandboxes)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore

#: What the seeded tenant's store holds: a proven calculator.add with a contract whose deliverable is a schema.
ADD = "return args[0] + args[1]"
SHOUT = "return args[0].upper() + '!'"


def seed(state_dir: Path, role: str, method: str, code: str, *calls: list[object], **contract: object) -> None:
    """Forge ``role.method`` from ``code`` through the real lifecycle and prove it with ``calls``."""
    with Workspace(
        provider=ScriptedProvider([code]),
        sandbox="subprocess",
        store=ToolStore(state_dir),
        log=state_dir / "logs" / "calls.jsonl",
    ) as ws:
        if contract:
            ws.register_tool(role, **contract)  # type: ignore[arg-type]
        for args in calls:
            outcome = ws.call(role, method, *args)
            assert outcome.ok, outcome


@pytest.fixture(scope="session")
def seeded_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory with calculator.add (contract, deliverable schema) and shouter.shout, both healthy."""
    state = tmp_path_factory.mktemp("tenant-a")
    seed(state, "calculator", "add", ADD, [1, 2], [3, 4], purpose="Add two numbers.",
         deliverable={"type": "number"})  # fmt: skip
    seed(state, "shouter", "shout", SHOUT, ["hi"], purpose="Shout a word.")
    return state


@pytest.fixture
def tenant_a(seeded_state: Path, tmp_path: Path) -> Path:
    """A private copy of the seeded state (tests may add tools to it)."""
    copy = tmp_path / "tenant-a"
    shutil.copytree(seeded_state, copy)
    return copy


def sandforge_command() -> str:
    """The installed console script beside this interpreter."""
    script = Path(sys.executable).parent / "sandforge"
    assert script.exists(), script
    return str(script)
