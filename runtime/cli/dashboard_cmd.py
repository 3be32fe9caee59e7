"""`sandforge dashboard`: the artifact-health dashboard of this machine's store, in the browser (issue 21).

Binds 127.0.0.1 only, serves one tenant (``local``: the state directory's ToolStore and call log) with a token
made for this run, and prints a one-time login link (the browser then keeps the token in an HTTP-only cookie).
The token itself goes to standard error, for the JSON twins (``curl -H "Authorization: Bearer ..."``).
``sandforge serve`` serves the same pages to every tenant at /dashboard.
"""

from __future__ import annotations

import socket
from pathlib import Path

import click

from sandforge.runtime.errors import UsageError

LOCAL_TENANT = "local"


@click.command("dashboard")
@click.option("--port", type=click.IntRange(0, 65535), default=8701, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")  # fmt: skip
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The state directory to show (default: $SANDFORGE_STATE_DIR, else the user state directory).",
              )  # fmt: skip
def command(port: int, state_dir: Path | None) -> None:
    """Serve the dashboard of this machine's tool store and call log on 127.0.0.1 until Ctrl-C."""
    from sandforge.runtime.service.server import build_server
    from sandforge.runtime.service.tenants import ServerConfig, TenantConfig, hash_token, new_token
    from sandforge.runtime.state_dir import resolve_state_dir

    state = resolve_state_dir(state_dir).resolve()
    token = new_token()
    tenant = TenantConfig(name=LOCAL_TENANT, token_hashes=(hash_token(token),), state_dir=state)
    config = ServerConfig(state_dir=state, audit_log=state / "logs" / "dashboard-audit.jsonl", tenants=(tenant,))
    sock = socket.socket()  # bound and listening before the URL is printed: a client may connect at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        raise UsageError(f"--port {port}: cannot listen on 127.0.0.1 ({exc.strerror or exc})") from None
    sock.listen(128)
    port = sock.getsockname()[1]
    server = build_server(config, host="127.0.0.1", port=port)
    code = server.gate.app.state.dashboard.sessions.add_login_code(token)  # type: ignore[attr-defined]
    click.echo(f"http://127.0.0.1:{port}/dashboard/login?code={code}")
    click.echo(f"sandforge dashboard: {state} on http://127.0.0.1:{port}/dashboard (the link above logs in once; "
               f"API token for the JSON twins: {token})", err=True)  # fmt: skip
    server.run(sockets=[sock])
