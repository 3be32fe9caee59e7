"""Shared set-up of the framework tests: one store directory, two sessions on it (each a new Workspace).

The first session's sandforge provider writes ``calculator.add`` once (a scripted program); the second has no
program left to give, so an answer there can only come from the stored tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandforge.integrations.core import SandforgeTools
from sandforge.runtime.agent import CallLog, CallRecord, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Sandbox, SandboxConfig

ADD_INPUTS = {"add": [{"name": "a", "type": "int", "description": "first addend"},
                      {"name": "b", "type": "int", "description": "second addend"}]}  # fmt: skip
ADD_PROGRAM = "return args[0] + args[1]\n"
#: A program the default policy refuses, and the fix it answers with.
REFUSED = "import os\nreturn os.listdir('/')"
FIX = "Remove the import of os"


@dataclass
class Sessions:
    root: Path
    sandbox: Sandbox
    opened: list[tuple[Workspace, ScriptedProvider]] = field(default_factory=list)

    def open(self, programs: list[str]) -> tuple[SandforgeTools, ScriptedProvider]:
        provider = ScriptedProvider(programs)
        ws = Workspace(provider=provider, sandbox=self.sandbox, store=ToolStore(self.root), log=CallLog(None))
        ws.register_tool("calculator", purpose="add two integers", inputs=ADD_INPUTS)
        self.opened.append((ws, provider))
        return SandforgeTools(ws), provider

    def first(self) -> tuple[SandforgeTools, ScriptedProvider]:
        return self.open([ADD_PROGRAM])

    def second(self) -> tuple[SandforgeTools, ScriptedProvider]:
        return self.open([])


def calls(forge: SandforgeTools) -> list[CallRecord]:
    return [r for r in forge.workspace.log.records if r.depth == 0 and r.role == "calculator"]


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Sessions]:
    s = Sessions(tmp_path / "state", Sandbox(SandboxConfig(backend="subprocess", pool_size=1)))
    yield s
    for ws, _ in s.opened:
        ws.close()
    s.sandbox.close()
