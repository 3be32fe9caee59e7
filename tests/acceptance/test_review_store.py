"""A store that refuses to write (issue 13 item 10: a symlinked role directory) is reported in one line.

The refusal is a typed ``StoreError`` the store raises on purpose; the call still succeeds and nothing is
written outside the store's tree. The host must not log it as an unexpected crash with a traceback.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from sandforge.runtime.agent import Agent
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore


def test_symlinked_role_directory_is_refused_without_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store_dir = tmp_path / "st"
    first = Agent.for_role(
        "math_helper", provider=ScriptedProvider(["return args[0] ** 0.5"]), store=ToolStore(store_dir)
    )
    assert first.sqrt(9).value == 3.0
    first.workspace.close()
    (role_dir,) = (store_dir / "tools").glob("math_helper-*")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(str(role_dir), str(outside / role_dir.name))
    role_dir.symlink_to(outside / role_dir.name)
    before = {p: p.read_bytes() for p in (outside / role_dir.name).iterdir()}

    caplog.set_level(logging.WARNING)
    again = Agent.for_role(
        "math_helper", provider=ScriptedProvider(["return args[0] ** 0.5"] * 3), store=ToolStore(store_dir)
    )
    outcome = again.sqrt(25)
    again.workspace.close()

    assert outcome.ok and outcome.value == 5.0
    assert {p: p.read_bytes() for p in (outside / role_dir.name).iterdir()} == before
    assert not [r.getMessage() for r in caplog.records if r.exc_info], "a refused store write logged a traceback"
