"""What every command group shares: typed errors as one line (or one JSON object under ``--json``) with the exit
status of ``runtime/cli/exits.py``, usage errors as JSON under ``--json``, Ctrl-C as 130."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from sandforge.runtime.cli.exits import JSON_ERRORS, Exit, json_requested, report, report_click, report_sandforge
from sandforge.runtime.errors import SandforgeError
from sandforge.sandbox.config import SandboxConfigError


class SandforgeGroup(click.Group):
    """A click group that turns SandforgeError into one line on stderr, also when used on its own."""

    def main(self, args: Sequence[str] | None = None, *pos: Any, **kwargs: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        token = JSON_ERRORS.set(json_requested(argv))
        try:
            return super().main(argv, *pos, **kwargs)
        finally:
            JSON_ERRORS.reset(token)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:  # fmt: skip
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:  # the group's own options or a missing command
            if not JSON_ERRORS.get():
                raise
            raise click.exceptions.Exit(report_click(exc)) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SandforgeError as exc:
            ctx.exit(report_sandforge(exc))
        except SandboxConfigError as exc:  # a malformed SANDFORGE_* setting: a usage error
            report("config_error", str(exc) + _set_by(ctx, str(exc)), Exit.USAGE)
            ctx.exit(Exit.USAGE)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.ClickException as exc:  # a subcommand's usage error
            if not JSON_ERRORS.get():
                raise
            ctx.exit(report_click(exc))
        except KeyboardInterrupt:
            click.echo("", err=True)
            report("interrupted", "interrupted", Exit.INTERRUPTED)
            ctx.exit(Exit.INTERRUPTED)
        return None


def _set_by(ctx: click.Context, message: str) -> str:
    """`` (set in FILE)`` when the variable the message names came from the configuration file."""
    path, applied = ctx.meta.get("sandforge.config", (None, []))
    named = [key for key in applied if f"SANDFORGE_{key.upper()}" in message]
    return f" (set in {path})" if path is not None and named else ""
