"""Importing the chat layer stays light: the chat providers share a folder with the program providers, but
``import sandforge.runtime.sessions`` (what ``sandforge chat`` starts with) loads neither the store, the
sandbox layer, PyYAML nor the anthropic SDK; they load when a tool runs or a YAML file is read."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("sandforge.runtime.store", "sandforge.sandbox", "sandforge.runtime.agent", "yaml", "anthropic")


def _loaded_after(statement: str) -> list[str]:
    probe = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def test_importing_sessions_loads_nothing_heavy() -> None:
    loaded = _loaded_after("import sandforge.runtime.sessions")
    assert [m for m in HEAVY if m in loaded] == []


def test_provider_names_still_import_from_the_package() -> None:
    loaded = _loaded_after(
        "from sandforge.runtime.providers import GenerationRequest, ScriptedProvider, render_prompt, ToolContract"
    )
    assert "sandforge.runtime.providers.scripted" in loaded
    assert "anthropic" not in loaded
