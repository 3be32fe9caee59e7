"""Which commands `sandforge` has, and the group that imports a command's module only when that command runs.

Importing every command module before dispatch loaded the sandbox, agent, store and policy layers for
``sandforge --version`` (0.8 s against 0.04 s for click itself, issue 39). `LazyGroup` imports
``sandforge.runtime.cli.<name>_cmd`` (its ``command`` attribute is the click command) on first use; ``--help``
and shell completion list the commands from `COMMANDS`, whose summaries a test keeps equal to each command's
own short help."""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING, Any

import click

from sandforge.runtime.cli.common import SandforgeGroup

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

#: Every command: its name (its module is ``<name>_cmd``) and its one-line summary.
COMMANDS: dict[str, str] = {
    "bench": "Measure latency, cold starts and throughput of every backend beside the peers; print a compact table.",
    "chat": "Chat with tools; loaded tool groups stay loaded across turns.",
    "cleanup": "List (or remove, with --apply) the sandboxes and files of sandforge processes that are gone.",
    "cluster": "A local Ray cluster on 127.0.0.1 with token authentication (for tests and trying the Ray executor).",
    "config": "Show every SANDFORGE_* setting: its value and source (environment, configuration file or default).",
    "context": "Read and set a role's committed context (tool state), as serve and mcp keep it.",
    "dashboard": "Serve the dashboard of this machine's tool store and call log on 127.0.0.1 until Ctrl-C.",
    "demo": "Run a calculator agent through the lifecycle: guardrail recovery, rollback, state, nested calls.",
    "deploy": "Deployment manifests (rendered and validated here; applying them is kubectl's job).",
    "doctor": "Probe backends with a real execution and show which protections are active.",
    "envs": "Environments: third-party packages built on the host for tool programs, mounted read-only.",
    "exec": "Validate FILE (a tool program body; - reads standard input) with the policy, run it in a fresh sandbox, "
    "print the outcome.",
    "image": "The sandbox image used by the docker and gvisor backends.",
    "logs": "Show the call log: one entry per logical call, nested calls indented under their trace.",
    "mcp": "Serve sandforge's tools to an MCP client over stdio (one tenant).",
    "policy": "Guardrail policies: check programs, lint, test, explain, list and diff policies.",
    "serve": "Serve the HTTP API (POST /v1/exec, /v1/agents/ROLE/METHOD, ...) until SIGINT/SIGTERM.",
    "sessions": "Chat sessions persisted by `sandforge chat`.",
    "tokens": "Create and revoke the API tokens of `sandforge serve` tenants (a running server sees the change).",
    "tools": "Inspect and maintain the persistent ToolStore.",
}


def command_module(name: str) -> str:
    """The module defining command ``name``."""
    return f"sandforge.runtime.cli.{name}_cmd"


def available_commands() -> list[str]:
    """The commands this install can run, sorted: ``bench`` only in a source checkout (an installed wheel ships
    no benchmark harness, and lists no command it cannot run)."""
    from sandforge.runtime.cli import bench_cmd  # click and a path check: cheap

    return sorted(name for name in COMMANDS if name != "bench" or bench_cmd.available())


class LazyGroup(SandforgeGroup):
    """A `SandforgeGroup` whose commands are the modules named in `COMMANDS`, each imported when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(available_commands()) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in available_commands():
            return None
        collecting = gc.isenabled()
        gc.disable()  # a command's modules: classes and functions that live until exit, no garbage to find
        try:
            command = importlib.import_module(command_module(cmd_name)).command
        finally:
            if collecting:  # (runtime.gc_pause's, inline: a light command loads no module it does not use)
                gc.enable()
        if not isinstance(command, click.Command):  # pragma: no cover - a module that lost its command
            raise TypeError(f"{command_module(cmd_name)}.command is not a click command")
        self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The ``Commands`` section of ``--help`` from `COMMANDS`, formatted as click formats loaded commands."""
        rows = [(name, _summary(self, ctx, name)) for name in self.list_commands(ctx)]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, summary.get_short_help_str(limit)) for name, summary in rows])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Command names (with their summaries) and the group's options, without importing any command."""
        from click.shell_completion import CompletionItem

        items = [
            CompletionItem(name, help=_summary(self, ctx, name).get_short_help_str())
            for name in self.list_commands(ctx)
            if name.startswith(incomplete)
        ]
        return items + click.Command.shell_complete(self, ctx, incomplete)


def _summary(group: click.Group, ctx: click.Context, name: str) -> click.Command:
    """A command carrying ``name``'s help: the loaded command itself, otherwise a stand-in with its summary (so
    click's own short-help shortening applies to both alike)."""
    loaded: Any = group.commands.get(name)
    return loaded if isinstance(loaded, click.Command) else click.Command(name, help=COMMANDS[name])
