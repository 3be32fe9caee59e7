"""`sandforge chat`: an interactive chat session whose tool groups survive turns (RFC-044).

Group tools run through the Agent lifecycle in a disposable sandbox. `--scripted FILE` replays a chat script
(turns, and optionally `programs` for the tool programs and `groups` to offer) instead of calling Claude.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.cli.model_options import model_options, model_settings
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import make_dirs
from sandforge.runtime.providers.chat import read_script
from sandforge.runtime.sessions import (
    AgentToolRunner,
    ChatProvider,
    CompositeGroupSource,
    GroupSource,
    ScriptedChatProvider,
    Session,
    SessionError,
    SessionStore,
    StaticGroupSource,
    ToolGroup,
    ToolRegistry,
    ToolRunner,
    ToolStoreGroupSource,
    TurnResult,
    UnavailableRunner,
    state_dir,
)
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import BACKENDS, Sandbox, SandboxConfig

log = logging.getLogger(__name__)

GROUPS_FILE_NAMES = ("tool_groups.yaml", "tool_groups.yml", "tool_groups.json")
HISTORY_FILE_NAME = "chat_history"
HELP = "commands: /tools (active groups), /clear (new session), /exit"


def _groups_source(
    groups_file: Path | None, script: dict[str, Any] | None, state: Path, *, tool_store: ToolStore | None
) -> GroupSource:
    """Configured groups first (--groups, the script's, or <state>/tool_groups.yaml), then the ToolStore's roles."""
    sources: list[GroupSource] = []
    if groups_file is not None:
        sources.append(StaticGroupSource.from_file(groups_file))
    elif script is not None and "groups" in script:
        try:
            sources.append(StaticGroupSource([ToolGroup.model_validate(g) for g in script["groups"]]))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"invalid 'groups' in the chat script: {exc}") from exc
    else:
        for name in GROUPS_FILE_NAMES:
            if (state / name).is_file():
                sources.append(StaticGroupSource.from_file(state / name))
                break
    if tool_store is not None:
        sources.append(ToolStoreGroupSource(tool_store))
    return CompositeGroupSource(*sources)


def _program_provider(
    script: dict[str, Any] | None, programs_file: Path | None, kind: str | None, settings: dict[str, Any]
) -> tuple[Any, str | None]:
    """The provider that writes tool programs for the Agent, or (None, why not)."""
    from sandforge.runtime.providers import GeneratedProgram, ScriptedProvider
    from sandforge.runtime.providers.factory import ModelSettings, ProviderUnavailable, program_provider

    if programs_file is not None:
        return ScriptedProvider(programs_file), None
    if script is not None and "programs" in script:
        items = script["programs"]
        if not isinstance(items, list):
            raise UsageError("'programs' in the chat script must be a list")
        try:
            return ScriptedProvider(
                [p if isinstance(p, str) else GeneratedProgram.model_validate(p) for p in items]
            ), None
        except ValueError as exc:
            raise UsageError(f"invalid 'programs' in the chat script: {exc}") from exc
    if kind is None and not os.environ.get("ANTHROPIC_API_KEY"):
        return None, "no program provider (set ANTHROPIC_API_KEY, or give 'programs' in the --scripted file)"
    replay = settings.pop("recording", None)
    try:
        return program_provider(kind or "anthropic", ModelSettings(**settings), replay=replay), None
    except ProviderUnavailable as exc:
        return None, exc.message


def _chat_provider(script: dict[str, Any] | None, kind: str | None, settings: dict[str, Any]) -> ChatProvider:
    """The scripted turns, else the chat model of ``kind`` (default: anthropic)."""
    if script is not None:
        return ScriptedChatProvider(script["turns"])
    from sandforge.runtime.providers.factory import ModelSettings, chat_provider

    replay = settings.pop("recording", None)
    try:
        return chat_provider(kind or "anthropic", ModelSettings(**settings), replay=replay)
    except ValueError as exc:  # pydantic's: a setting out of range
        raise UsageError(f"invalid model options: {str(exc).splitlines()[-1].strip()}") from None


@contextlib.contextmanager
def _readline_history(state: Path) -> Iterator[None]:
    """Line editing and a persistent input history, when talking to a terminal."""
    if not sys.stdin.isatty():
        yield
        return
    try:
        import readline
    except ImportError:  # not on every platform
        yield
        return
    path = state / HISTORY_FILE_NAME
    with contextlib.suppress(OSError):
        if stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device there would hang or flood the read
            readline.read_history_file(path)
    readline.set_history_length(1000)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # what the user typed: private, like the session database
            make_dirs(path.parent)
            if not path.exists() or stat.S_ISREG(path.stat().st_mode):
                path.touch(mode=0o600)
                readline.write_history_file(path)
                path.chmod(0o600)


def _print_tools(session: Session) -> None:
    core = [t.name for t in session.registry.core_tools()]
    click.echo(f"core:      {', '.join(core)}")
    loaded = session.active_groups()
    if loaded:
        for name in loaded:
            group = session.registry.get_group(name)
            tools = ", ".join(t.name for t in group.tools) if group else ""
            click.echo(f"loaded:    {name} ({tools})")
    else:
        click.echo("loaded:    (none)")
    rest = [g for g in session.registry.group_names() if g not in loaded]
    click.echo(f"available: {', '.join(rest) if rest else '(none)'}")


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _print_turn(result: TurnResult) -> None:
    for c in result.tool_calls:
        args = json.dumps(c.input, ensure_ascii=False)
        click.echo(f"  [{c.name}({_short(args, 80)}) -> {c.status.value}] {_short(c.content)}", err=True)
    if result.text:
        click.echo(f"assistant> {result.text}")
    if result.stop_reason == "max_model_calls":
        click.echo("  (stopped: too many tool rounds in one turn)", err=True)


def _repl(session: Session) -> Session:
    while True:
        try:
            line = input("you> ")
        except EOFError:
            click.echo()
            return session
        except KeyboardInterrupt:
            click.echo()
            return session
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd = text.split()[0].lower()
            if cmd in ("/exit", "/quit"):
                return session
            if cmd == "/clear":
                session = session.clear()
                click.echo(f"new session {session.id} (core tools only)")
            elif cmd == "/tools":
                _print_tools(session)
            elif cmd == "/help":
                click.echo(HELP)
            else:
                click.echo(f"unknown command {cmd}; {HELP}", err=True)
            continue
        try:
            result = session.send(text)
        except SessionError as exc:  # the model failed; the user message is kept, the chat goes on
            click.echo(f"error: {exc}", err=True)
            continue
        except KeyboardInterrupt:  # the unfinished response is not persisted; the user message is
            click.echo("\n(interrupted)", err=True)
            continue
        _print_turn(result)


@click.command("chat")
@click.option("--session", "session_id", default=None, help="Resume this session (id or unique prefix).")
@click.option(
    "--scripted",
    "script_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Replay this chat script (JSON/YAML: turns, optional programs and groups) instead of Claude.",
)
@click.option(
    "--groups",
    "groups_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Tool group file (YAML/JSON). Default: the script's groups, or <state-dir>/tool_groups.yaml.",
)
@click.option(
    "--programs",
    "programs_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Scripted tool programs for the Agent (JSON list or '# ---'-separated text).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where sessions.db lives (default: SANDFORGE_STATE_DIR or the user state directory).",
)
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="Default: SANDFORGE_BACKEND or subprocess.")
@click.option("--provider", "provider_kind", type=click.Choice(["anthropic", "openai", "replay"]), default=None,
              help="The model behind the chat and its tool programs (default: anthropic; --scripted replays a script).")
@model_options()
@click.option(
    "--tool-store/--no-tool-store", default=True, help="Offer the ToolStore's roles as loadable groups (default: on)."
)
@click.option("--no-restore", is_flag=True, hidden=True, help="Do not restore loaded groups (shows the RFC-044 bug).")
@policy_options()
def command(
    session_id: str | None,
    script_path: Path | None,
    groups_file: Path | None,
    programs_file: Path | None,
    state_dir: Path | None,
    backend: str | None,
    provider_kind: str | None,
    tool_store: bool,
    no_restore: bool,
    policies: tuple[Path, ...],
    no_default: bool,
    **model: Any,
) -> None:
    """Chat with tools; loaded tool groups stay loaded across turns. Type /exit (or EOF) to leave."""
    state = _state(state_dir)
    script = read_script(script_path) if script_path is not None else None
    settings = model_settings(model)
    if provider_kind == "replay" and "recording" not in settings:
        raise UsageError("--provider replay needs --replay FILE")
    provider = _chat_provider(script, provider_kind, dict(settings))
    # One ToolStore serves both sides: its roles are loadable groups, and their calls reuse its artifacts.
    tools = ToolStore(state) if tool_store else None
    registry = ToolRegistry(_groups_source(groups_file, script, state, tool_store=tools))
    program_provider, why_not = _program_provider(script, programs_file, provider_kind, dict(settings))
    policy = load_policy_option(policies, no_default) if policies or no_default else None  # checked up front
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(SessionStore(state=state))
        runner: ToolRunner
        if program_provider is None:
            runner = UnavailableRunner(why_not or "no program provider")
        else:
            config = SandboxConfig.from_env(**({"backend": backend} if backend else {}))
            sandbox = stack.enter_context(Sandbox(config))
            agent_runner = AgentToolRunner(
                provider=program_provider, sandbox=sandbox, store=tools, log=_call_log(state_dir), policy=policy
            )
            stack.callback(agent_runner.close)
            runner = agent_runner
        options: dict[str, Any] = {
            "provider": provider,
            "registry": registry,
            "runner": runner,
            "restore_groups": not no_restore,
        }
        if session_id:
            session = Session.open(store, session_id, **options)
            count = len(session.history())
            groups = session.active_groups()
            click.echo(f"session {session.id} resumed ({count} messages; groups: {', '.join(groups) or 'none'})")
        else:
            session = Session.create(store, **options)
            click.echo(f"session {session.id} (new)")
        click.echo(HELP)
        with _readline_history(state):
            session = _repl(session)
        click.echo(f"session {session.id} saved")


def _call_log(state_dir_option: Path | None) -> Path | None:
    """Tool calls go to the Agent's call log (`sandforge logs`): with --state-dir, the one under it."""
    if state_dir_option is None or os.environ.get("SANDFORGE_CALL_LOG"):
        return None
    return state_dir_option / "logs" / "calls.jsonl"


def _state(override: Path | None) -> Path:
    return state_dir(override)
