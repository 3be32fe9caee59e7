"""What every command group shares: a SandforgeError becomes one `error:` line and its typed exit code."""

from __future__ import annotations

import click

from sandforge.runtime.errors import SandforgeError
from sandforge.sandbox.config import SandboxConfigError


class SandforgeGroup(click.Group):
    """A click group that turns SandforgeError into one line on stderr, also when used on its own."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SandforgeError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except SandboxConfigError as exc:  # a malformed SANDFORGE_* setting: a usage error
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
