"""Importing the chat layer stays light: the chat providers share a folder with the program providers, but
``import sandforge.runtime.sessions`` (what ``sandforge chat`` starts with) loads neither the store, the
sandbox layer, PyYAML nor the anthropic SDK; they load when a tool runs or a YAML file is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("sandforge.runtime.store", "sandforge.sandbox", "sandforge.runtime.agent", "yaml", "anthropic", "openai")


def _loaded_after(statement: str) -> list[str]:
    probe = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def test_importing_sessions_loads_nothing_heavy() -> None:
    loaded = _loaded_after("import sandforge.runtime.sessions")
    assert [m for m in HEAVY if m in loaded] == []


def test_naming_a_provider_loads_only_its_sdk() -> None:
    """The factory that every ``--provider`` goes through, and the tenants' configuration, load no SDK; building
    an openai provider loads ``openai`` and not ``anthropic`` (issue 40)."""
    loaded = _loaded_after("import sandforge.runtime.providers.factory, sandforge.runtime.service.tenants")
    assert "openai" not in loaded and "anthropic" not in loaded
    loaded = _loaded_after(
        "from sandforge.runtime.providers.factory import ModelSettings, program_provider; import os; "
        "os.environ['OPENAI_API_KEY'] = 'k'; program_provider('openai', ModelSettings())"
    )
    assert "openai" in loaded and "anthropic" not in loaded


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
CLI_HEAVY = ("pydantic", "pydantic_core", "yaml", "anthropic", "openai", "mcp", "jsonschema", "filelock", "starlette")


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


# ------------------------------------------------------------------------- `sandforge mcp` before its handshake

#: What ``sandforge mcp`` must not have imported when it answers ``initialize``: the tools' work, the agent,
#: the store itself and the sandbox backends load after the handshake (issue 39, item 2).
MCP_AFTER_HANDSHAKE = (
    "sandforge.runtime.service.mcp.operations",
    "sandforge.runtime.service.mcp.persisted",
    "sandforge.runtime.service.mcp.failure_result",
    "sandforge.runtime.agent.workspace",
    "sandforge.runtime.agent.program_exec",
    "sandforge.runtime.store.toolstore",
    "sandforge.runtime.environments.builder",
    "sandforge.sandbox.backends.subprocess_backend",
    "jsonschema",
    "docker",
)
INITIALIZE = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pin", "version": "0"}},
})  # fmt: skip


def test_mcp_answers_initialize_before_importing_the_tools(tmp_path: Path) -> None:
    """stdin holds ``initialize`` and ends: the server answers and exits, having loaded only what the answer
    needed (no ``notifications/initialized`` came, so the warm-up never started)."""
    probe = (
        "import json, sys\n"
        "from sandforge.runtime.cli import main\n"
        "try:\n    main(sys.argv[1:], prog_name='sandforge')\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\n' + json.dumps(sorted(sys.modules)))\n"
    )
    args = ["mcp", "--state-dir", str(tmp_path / "state"), "--provider", "none", "--backend", "subprocess"]
    done = subprocess.run([sys.executable, "-c", probe, *args], input=INITIALIZE + "\n", capture_output=True,
                          text=True, check=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert json.loads(done.stdout.splitlines()[0])["result"]["serverInfo"]["name"] == "sandforge"
    loaded = set(json.loads(done.stderr.rsplit("\n", 1)[1]))
    assert [m for m in MCP_AFTER_HANDSHAKE if m in loaded] == []


def test_mcp_warm_up_imports_the_tools_and_builds_the_workspace(tmp_path: Path) -> None:
    probe = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from sandforge.runtime.service.mcp import TenantMCP\n"
        "from sandforge.runtime.service.tenants import standalone_tenant\n"
        "rt = standalone_tenant('local', Path(sys.argv[1]), backend='subprocess')\n"
        "before = 'sandforge.runtime.service.mcp.operations' in sys.modules\n"
        "TenantMCP(rt).warm_up()\n"
        "print(json.dumps([before, 'sandforge.runtime.service.mcp.operations' in sys.modules, sorted(rt._parts)]))\n"
        "rt.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "state")], capture_output=True, text=True,
                          check=True, cwd=tmp_path, timeout=120)  # fmt: skip
    before, after, parts = json.loads(done.stdout.splitlines()[-1])
    assert (before, after) == (False, True)
    assert {"tool_store", "sandbox", "workspace"} <= set(parts)


# ------------------------------------------------------------------------------------ `sandforge exec`, end to end

#: What `sandforge exec` of a program that declares nothing and fetches nothing must not load: the container
#: engines' clients, the egress broker and its wire models, the environment builder, the agent's workspace,
#: providers and MCP (issue 39, item 1). The policy, the guardrails and the subprocess sandbox it does load.
EXEC_NEVER = (
    "docker",
    "requests",
    "httpx",
    "anthropic",
    "openai",
    "mcp",
    "jsonschema",
    "filelock",
    "sandforge.runtime.egress.broker",
    "sandforge.runtime.egress.wire",
    "sandforge.runtime.environments.builder",
    "sandforge.runtime.agent.workspace",
    "sandforge.runtime.service.mcp",
    # the lifecycle's port and what it brings (state, SQLite, the program providers): a run's record needs only
    # its identifiers (``runtime/agent/ids.py``)
    "sandforge.runtime.agent.env",
    "sandforge.runtime.agent.state",
    "sandforge.runtime.providers",
    "sqlite3",
    # the async API (``AsyncSandbox``, ``sandbox/aio.py``) and the store's models and health: the call log needs
    # only the store's enumerations (``runtime/store/kinds.py``); ``packaging`` only for a declared dependency
    "asyncio",
    "ssl",
    "sandforge.sandbox.aio",
    "sandforge.runtime.store.models",
    "sandforge.runtime.store.health",
    "packaging",
)


def test_exec_of_a_plain_program_loads_no_engine_broker_or_builder(tmp_path: Path) -> None:
    """The subprocess backend looks at the container engines for leftovers a few seconds after it starts
    (``sandbox/leftovers.py``); the probe puts that look out of its reach so the pin is about exec's own path."""
    (tmp_path / "two.py").write_text("return 1 + 1\n")
    probe = (
        "import json, sys\n"
        "from sandforge.sandbox import leftovers\n"
        "leftovers.CONTAINER_DELAY_S = 3600.0\n"
        "from sandforge.runtime.cli import main\n"
        "try:\n    main(sys.argv[1:], prog_name='sandforge')\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\n' + json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "SANDFORGE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-c", probe, "exec", "--backend", "subprocess", str(tmp_path / "two.py")],
                          capture_output=True, text=True, check=True, cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert done.stdout.startswith("ok: 2"), done.stderr[-2000:]
    loaded = set(json.loads(done.stderr.rsplit("\n", 1)[1]))
    assert [m for m in EXEC_NEVER if m in loaded] == []


#: What ``exec``'s own module may not load: it starts the subprocess zygote (``Sandbox.prestart``) before the
#: policy, the guardrails, the agent's run path and the call log load, so their imports run beside the zygote's
#: start (issue 39, item 1); only the sandbox package, click and the CLI's shared modules come first.
EXEC_AFTER_PRESTART = (
    "sandforge.runtime.guardrails",
    "sandforge.runtime.agent",
    "sandforge.runtime.store",
    "sandforge.runtime.environments",
    "sandforge.runtime.egress",
    "sandforge.sandbox.backends.subprocess_backend",
    "yaml",
    "packaging",
    "sqlite3",
    "RestrictedPython",
)


def test_exec_module_loads_only_the_sandbox_before_the_zygote_starts() -> None:
    loaded = _loaded_after("import sandforge.runtime.cli.exec_cmd")
    assert [m for m in loaded if m.startswith(EXEC_AFTER_PRESTART)] == []


def test_the_service_app_loads_the_mcp_sdk_only_for_a_first_mcp_request() -> None:
    """Every ``serve`` start builds the app; the MCP SDK (~0.7 CPU-s of model building) loads when a client first
    asks for ``/mcp`` (tests/service/mcp: the endpoint itself, over HTTP)."""
    loaded = _loaded_after("from sandforge.runtime.service.app import create_app")
    assert [m for m in loaded if m == "mcp" or m.startswith(("mcp.", "mcp_types"))] == []


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
