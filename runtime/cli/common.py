"""What every command shares: typed errors as one line (or one JSON object under ``--json``) with the exit
status of ``runtime/cli/exits.py``, usage errors as JSON under ``--json``, Ctrl-C as 130; the
``--policy``/``--no-default`` options and how they load."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sandforge.runtime.cli.exits import JSON_ERRORS, Exit, json_requested, report, report_click, report_sandforge
from sandforge.runtime.errors import SandforgeError, UsageError

if TYPE_CHECKING:
    from sandforge.runtime.guardrails.policy import Policy


class SandforgeGroup(click.Group):
    """A click group that turns SandforgeError into one line on stderr, also when used on its own."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``main()``, called with no arguments, runs this process's command line (the ``sandforge`` script,
        ``python -m sandforge``): a command that asked for it (`one_shot`) then ends the process without the
        interpreter's teardown. Called with arguments (``main(["exec", ...])``, tests, embedding code), it
        raises SystemExit as click does."""
        if args or kwargs:
            return self.main(*args, **kwargs)
        global _ENTRY
        _ENTRY = True
        try:
            return self.main()
        except SystemExit as done:
            if _ONE_SHOT and (done.code is None or isinstance(done.code, int)):
                end_process(done.code or 0)
            raise

    def main(self, args: Sequence[str] | None = None, *pos: Any, **kwargs: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        token = JSON_ERRORS.set(json_requested(argv))
        try:
            return super().main(argv, *pos, **kwargs)
        finally:
            JSON_ERRORS.reset(token)
            if _ONE_SHOT and not _ENTRY:  # called in-process (tests): the process goes on as it was
                _end_one_shot()

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
        except ValueError as exc:  # a malformed SANDFORGE_* setting (SandboxConfigError): a usage error
            if not _is_sandbox_config_error(exc):
                raise
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


#: Set by `one_shot`; whether the collector ran before it; whether the group is the process's entry point.
_ONE_SHOT = False
_COLLECTING = True
_ENTRY = False


def one_shot() -> None:
    """This process ends when the running command does (``exec``): collect no garbage cycles from here on, and
    end without the interpreter's teardown (`end_process`, from the entry point). Over a hundred pydantic models,
    the policy and the call log are loaded by then: the collector would walk them again and again and the
    teardown free them one by one, together a quarter of the command's CPU (issue 39), for objects that live
    until exit anyway and memory the kernel takes back at once. Tests calling `main` in-process are unaffected
    by the exit; they see the collector paused until the command returns."""
    global _ONE_SHOT, _COLLECTING
    if not _ONE_SHOT:
        _ONE_SHOT, _COLLECTING = True, gc.isenabled()
        gc.disable()


def _end_one_shot() -> None:
    """The process goes on (`main` called in-process): the collector as it was before `one_shot`."""
    global _ONE_SHOT
    _ONE_SHOT = False
    if _COLLECTING:
        gc.enable()


def end_process(code: int) -> None:
    """Exit with ``code`` as the interpreter would, minus its teardown: the output streams flushed and the exit
    handlers run (logging's, weakref finalizers, coverage), then `os._exit`. Returns (the caller exits the
    usual way) while another non-daemon thread runs, which the usual exit would wait for, or when a stream
    cannot be flushed, whose error the usual exit reports."""
    import atexit
    import os
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        code = 120  # what the interpreter's own exit returns when flushing fails at that point
    os._exit(code)


def _is_sandbox_config_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the sandbox layer's SandboxConfigError, without importing that layer (its import costs
    a light command its start-up): the class can only have been raised if its module was loaded."""
    module = sys.modules.get("sandforge.sandbox.config")
    return module is not None and isinstance(exc, module.SandboxConfigError)


def _set_by(ctx: click.Context, message: str) -> str:
    """`` (set in FILE)`` when the variable the message names came from the configuration file."""
    path, applied = ctx.meta.get("sandforge.config", (None, []))
    named = [key for key in applied if f"SANDFORGE_{key.upper()}" in message]
    return f" (set in {path})" if path is not None and named else ""


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
