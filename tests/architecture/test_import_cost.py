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


# ------------------------------------------------------------------------------------ the CLI's light commands

#: What ``sandforge`` itself may load before a light command answers: the group, its settings file reader, the
#: error types. No command module but the one that runs, no pydantic model, policy, sandbox, store or provider.
CLI_CORE = {
    "sandforge",
    "sandforge.runtime",
    "sandforge.runtime.cli",
    "sandforge.runtime.cli.common",
    "sandforge.runtime.cli.exits",
    "sandforge.runtime.cli.registry",
    "sandforge.runtime.cli.settings",
    "sandforge.runtime.errors",
    "sandforge.runtime.files",
    "sandforge.runtime.files.dirs",
    "sandforge.runtime.files.read",
    "sandforge.runtime.lazy",
}
#: Each light command's invocation and the sandforge modules it may load beyond `CLI_CORE` (issue 39).
LIGHT_COMMANDS: dict[str, tuple[list[str], set[str]]] = {
    "--version": (["--version"], set()),
    "--help": (["--help"], {"sandforge.runtime.cli.bench_cmd"}),
    "config": (
        ["config"],
        {
            "sandforge.runtime.cli.bench_cmd",
            "sandforge.runtime.cli.config_cmd",
            "sandforge.runtime.cli.output",
            "sandforge.runtime.telemetry",
            "sandforge.runtime.telemetry.api",
            "sandforge.runtime.telemetry.base",
        },
    ),
}
#: Third-party packages no light command loads (pydantic's models and core, the policy's YAML, providers, MCP).
CLI_HEAVY = ("pydantic", "pydantic_core", "yaml", "anthropic", "mcp", "jsonschema", "filelock", "starlette")


def _cli_modules(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    """The modules loaded once ``sandforge ARGS`` has finished, in a fresh interpreter."""
    probe = (
        "import json, sys\n"
        "from sandforge.runtime.cli import main\n"
        "try:\n    main(sys.argv[1:], prog_name='sandforge')\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\n' + json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, check=True)
    return set(json.loads(done.stderr.rsplit("\n", 1)[1]))


def _pinned(loaded: set[str], allowed: set[str]) -> tuple[list[str], list[str]]:
    ours = sorted(m for m in loaded if m.startswith("sandforge") and m not in CLI_CORE | allowed)
    heavy = sorted(m for m in loaded if m.split(".")[0] in CLI_HEAVY)
    return ours, heavy


def test_light_commands_load_only_their_own_modules() -> None:
    for name, (args, allowed) in LIGHT_COMMANDS.items():
        assert _pinned(_cli_modules(args), allowed) == ([], []), name


def test_completing_a_command_name_loads_no_command() -> None:
    import os

    env = {**os.environ, "_SANDFORGE_COMPLETE": "bash_complete", "COMP_WORDS": "sandforge c", "COMP_CWORD": "1"}
    assert _pinned(_cli_modules([], env), {"sandforge.runtime.cli.bench_cmd"}) == ([], [])


def test_running_a_command_loads_its_module_only() -> None:
    loaded = _cli_modules(["policy", "--help"])
    assert "sandforge.runtime.cli.policy_cmd" in loaded
    assert [m for m in loaded if m.endswith("_cmd") and m.rsplit(".", 1)[1] not in ("policy_cmd", "bench_cmd")] == []


# ------------------------------------------------------------------------------ the framework integrations

FRAMEWORKS = {"smolagents": "smolagents", "langchain": "langchain_core", "openai_agents": "agents",
              "pydantic_ai": "pydantic_ai"}  # fmt: skip


def test_integrations_import_only_the_framework_used() -> None:
    """The shared core loads no framework; each adapter loads its own and no other (issue 40)."""
    loaded = _loaded_after("import sandforge.integrations.core")
    assert [f for f in FRAMEWORKS.values() if f in loaded] == []
    for adapter, framework in FRAMEWORKS.items():
        try:
            __import__(framework)
        except ImportError:
            continue  # its extra is not installed here
        loaded = _loaded_after(f"import sandforge.integrations.{adapter}")
        assert [f for f in FRAMEWORKS.values() if f in loaded] == [framework], adapter
