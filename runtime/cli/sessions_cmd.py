"""`sandforge sessions list|show ID`: the persisted chat sessions (see docs/sessions.md)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.output import emit_json, rfc3339
from sandforge.runtime.sessions import Message, MessageType, SessionInfo, SessionStore, restore_loaded_groups

_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where sessions.db lives (default: SANDFORGE_STATE_DIR or the user state directory).",
)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def message_json(m: Message) -> dict[str, Any]:
    """The stable `--json` shape of one message (tool_input stays the stored text: it may be malformed)."""
    return {
        "id": m.id,
        "type": m.type.value,
        "content": m.content,
        "tool_name": m.tool_name,
        "tool_call_id": m.tool_call_id,
        "tool_status": m.tool_status.value if m.tool_status else None,
        "tool_input": m.tool_input,
        "created_at": rfc3339(m.created_at),
        "metadata": m.metadata,
    }


def session_json(info: SessionInfo) -> dict[str, Any]:
    """A session as ``--json`` prints it: its times in RFC 3339 UTC, like every JSON output."""
    data = info.model_dump(mode="json")
    return data | {"created_at": rfc3339(info.created_at), "updated_at": rfc3339(info.updated_at)}


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def format_message(index: int, m: Message, *, full: bool = False) -> str:
    text = m.content if full else _one_line(m.content)
    if m.type is MessageType.TOOL_CALL:
        status = m.tool_status.value if m.tool_status else "?"
        return f"{index:>4}  tool_call    {m.tool_name}({_one_line(m.tool_input or '', 120)}) -> {status}"
    if m.type is MessageType.TOOL_RESULT:
        flag = " (error)" if m.tool_status and m.tool_status.value == "error" else ""
        return f"{index:>4}  tool_result  {m.tool_name}{flag}: {text}"
    return f"{index:>4}  {m.type.value:<11}  {text}"


@click.group("sessions")
def command() -> None:
    """Chat sessions persisted by `sandforge chat`."""


@command.command("list")
@_state_dir_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show only the N most recent.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
def list_cmd(state_dir: Path | None, limit: int | None, as_json: bool) -> None:
    """List sessions, most recently used first."""
    with SessionStore(state=state_dir) as store:
        sessions = store.list_sessions(limit=limit)
    if as_json:
        emit_json([session_json(s) for s in sessions])
        return
    if not sessions:
        click.echo("no sessions")
        return
    click.echo(f"{'ID':<16}  {'UPDATED':<19}  {'MSGS':>5}  TITLE")
    for s in sessions:
        lineage = f"  (cleared {s.cleared_from[:8]})" if s.cleared_from else ""
        click.echo(f"{s.id:<16}  {_when(s.updated_at)}  {s.message_count:>5}  {_one_line(s.title, 60)}{lineage}")


@command.command("show")
@click.argument("session_id")
@_state_dir_option
@click.option("--full", is_flag=True, help="Do not shorten message contents.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_cmd(session_id: str, state_dir: Path | None, full: bool, as_json: bool) -> None:
    """Show one session (id or unique prefix): its messages and the groups its next turn restores."""
    with SessionStore(state=state_dir) as store:
        info = store.get_session(session_id)
        messages = store.messages(info.id)
    groups = restore_loaded_groups(messages)
    if as_json:
        payload = {
            "session": session_json(info),
            "loaded_groups": groups,
            "messages": [message_json(m) for m in messages],
        }
        emit_json(payload)
        return
    click.echo(f"session  {info.id}")
    if info.title:
        click.echo(f"title    {info.title}")
    click.echo(f"created  {_when(info.created_at)}   updated {_when(info.updated_at)}")
    if info.cleared_from:
        click.echo(f"cleared  from {info.cleared_from}")
    click.echo(f"groups   {', '.join(groups) if groups else '(none)'}")
    click.echo(f"messages {len(messages)}")
    for i, m in enumerate(messages, 1):
        click.echo(format_message(i, m, full=full))
