"""`sandforge` command line. Each command lives in its own module (``<name>_cmd.py``), imported only when that
command runs (`registry.LazyGroup`), so ``--version`` and ``--help`` load click and little else."""

from __future__ import annotations

import logging
import time

import click

from sandforge import __version__
from sandforge.runtime.cli.registry import LazyGroup
from sandforge.runtime.cli.settings import CONFIG_ENV, apply_config, load_config

#: Log lines carry RFC 3339 UTC timestamps, like every JSON output.
LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
LOG_DATEFMT = "%Y-%m-%dT%H:%M:%S"


def configure_logging(verbose: int) -> None:
    formatter = logging.Formatter(LOG_FORMAT, LOG_DATEFMT)
    formatter.converter = time.gmtime
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), handlers=[handler])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(version=__version__, message="sandforge %(version)s")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--config", "config_path", envvar=CONFIG_ENV, default=None, metavar="FILE", show_default=False,
              help="Settings file (default: sandforge.toml, or [tool.sandforge] in pyproject.toml, from the "
                   "current directory up). Flags and SANDFORGE_* variables win over it.")  # fmt: skip
@click.pass_context
def main(ctx: click.Context, verbose: int, config_path: str | None) -> None:
    """sandforge: run LLM-generated tools in disposable sandboxes, validated first, committed on success."""
    configure_logging(verbose)
    found = load_config(config_path)
    if found is not None:
        path, table = found
        ctx.meta["sandforge.config"] = (path, apply_config(path, table))
    from sandforge.runtime import telemetry

    ctx.call_on_close(telemetry.flush)  # spans of a short command are exported before it exits
