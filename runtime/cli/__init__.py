"""`sandforge` command line. Each command group lives in its own module and is registered here."""

from __future__ import annotations

import logging

import click

from sandforge.runtime.cli.common import SandforgeGroup


@click.group(cls=SandforgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """sandforge: run LLM-generated tools in disposable sandboxes, validated first, committed on success."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from sandforge.runtime.cli import (
        chat_cmd,
        cleanup_cmd,
        demo_cmd,
        doctor_cmd,
        envs_cmd,
        exec_cmd,
        image_cmd,
        logs_cmd,
        mcp_cmd,
        policy_cmd,
        serve_cmd,
        sessions_cmd,
        tokens_cmd,
        tools_cmd,
    )

    for module in (exec_cmd, doctor_cmd, image_cmd, tools_cmd, chat_cmd, sessions_cmd, logs_cmd, demo_cmd, policy_cmd):
        main.add_command(module.command)
    main.add_command(cleanup_cmd.command)
    main.add_command(envs_cmd.command)
    main.add_command(serve_cmd.command)
    main.add_command(tokens_cmd.command)
    main.add_command(mcp_cmd.command)
    from sandforge.runtime.cli import cluster_cmd, deploy_cmd  # issue 22

    main.add_command(cluster_cmd.command)
    main.add_command(deploy_cmd.command)


_register()
