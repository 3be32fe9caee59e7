"""What every command shares: a SandforgeError becomes one `error:` line and its typed exit code; the
``--policy``/``--no-default`` options and how they load."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sandforge.runtime.errors import SandforgeError, UsageError
from sandforge.sandbox.config import SandboxConfigError

if TYPE_CHECKING:
    from sandforge.runtime.guardrails.policy import Policy


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


# ------------------------------------------------------------------------------------------ --policy

F = TypeVar("F", bound=Callable[..., Any])


def policy_options(*, no_default: bool = True, envvar: str | None = None) -> Callable[[F], F]:
    """``--policy PATH`` (a directory or a single YAML file; repeatable, later layers win) and, where the command
    can run without the default layer, ``--no-default``. Every command that takes a policy uses this, so the flag
    means the same everywhere; the values reach the command as ``policies`` and ``no_default``; load them with
    `load_policy_option`."""

    def decorate(func: F) -> F:
        if no_default:
            func = click.option(
                "--no-default",
                "no_default",
                is_flag=True,
                help="Do not put the default policy underneath the --policy layers.",
            )(func)
        return click.option(
            "--policy",
            "policies",
            multiple=True,
            type=click.Path(path_type=Path),
            envvar=envvar,
            help="A policy directory or YAML file layered over the default policy; repeat to add layers "
            "(later wins)." + (f" Env: {envvar} (':'-separated)." if envvar else ""),
        )(func)

    return decorate


def load_policy_option(policies: Sequence[Path], no_default: bool = False) -> Policy:
    """The effective policy of ``--policy``/``--no-default``: the default policy when no layer is given."""
    from sandforge.runtime.guardrails.loader import layered_policy

    if no_default and not policies:
        raise UsageError("--no-default needs at least one --policy")
    return layered_policy(tuple(policies), include_default=not no_default)
