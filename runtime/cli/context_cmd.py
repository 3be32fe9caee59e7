"""`sandforge context show|set ROLE`: a role's committed context in a state directory's ``state.db``.

The same database ``serve`` and ``mcp`` commit to (a tenant of ``server.yaml`` keeps it in
``<state_dir>/tenants/<name>``), read and written in its own transactions, so this works beside a running
server. ``set`` replaces the whole context; with ``--if-match`` only when it is still that version (the ETag
``show --json`` and ``GET /v1/roles/ROLE/context`` give), as ``PUT`` does over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import SandforgeError, UsageError
from sandforge.runtime.names import valid_role

#: The largest context ``set`` reads (a file, an argument or standard input).
MAX_CONTEXT_BYTES = 64 << 20


class StaleContext(SandforgeError):
    """``set --if-match`` named another version than the committed one: nothing was written (exit 1)."""


def _db(state_dir: Path | None) -> Any:
    from sandforge.runtime.agent.statedb import DB_FILE_NAME, StateDB
    from sandforge.runtime.state_dir import resolve_state_dir

    return StateDB(resolve_state_dir(state_dir) / DB_FILE_NAME)


def _role(role: str) -> str:
    if not valid_role(role):
        raise UsageError(f"{role!r} is not a role name (a letter, then letters, digits, '_', '.', '-'; at most 64)")
    return role


def _context(text: str | None, file: str | None) -> dict[str, Any]:
    from sandforge.runtime.files import decode_json, read_arg_file

    if (text is None) == (file is None):
        raise UsageError("give the context as JSON or with --file FILE (- reads standard input), not both")
    if file is not None:
        raw, what = read_arg_file(file, limit=MAX_CONTEXT_BYTES, what="context file"), f"context file {file}"
    else:
        assert text is not None
        raw, what = text.encode("utf-8", "surrogateescape"), "the context"
    value = decode_json(raw, what=what)
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object")
    return value


_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The state directory holding state.db (default: $SANDFORGE_STATE_DIR, else the user state dir; a "
    "server tenant's is <state_dir>/tenants/<name>).",
)


@click.group("context")
def command() -> None:
    """Read and set a role's committed context (tool state), as serve and mcp keep it."""


@command.command("show")
@click.argument("role")
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print {role, context, version, etag} as one JSON object.")
def show_cmd(role: str, state_dir: Path | None, as_json: bool) -> None:
    """Print ROLE's committed context ({} before its first commit)."""
    db = _db(state_dir)
    try:
        committed = db.read(_role(role))
    finally:
        db.close()
    context = committed.snapshot.to_dict()
    if as_json:
        emit_json({"role": role, "context": context, "version": committed.version, "etag": committed.etag})
    else:
        emit_json(context)


@command.command("set")
@click.argument("role")
@click.argument("context", required=False)
@click.option("--file", "file", default=None, help="Read the context (a JSON object) from FILE; - reads stdin.")
@click.option("--if-match", "if_match", default=None, help="Only if the context is still this ETag (exit 1 if not).")
@_state_dir_option
def set_cmd(role: str, context: str | None, file: str | None, if_match: str | None, state_dir: Path | None) -> None:
    """Replace ROLE's committed context with CONTEXT (a JSON object) or the object in --file."""
    from sandforge.sandbox.context import ContextError, ContextSnapshot

    value = _context(context, file)
    try:
        snapshot = ContextSnapshot.from_dict(value)
    except ContextError as exc:
        raise UsageError(str(exc)) from None
    db = _db(state_dir)
    try:
        now, written = db.replace(_role(role), snapshot, if_match)
    finally:
        db.close()
    if not written:
        raise StaleContext(f"the context of {role} changed: it is {now.etag} now; nothing was written")
    click.echo(f"{role}: version {now.version}, etag {now.etag}")
