"""`sandforge serve`: the HTTP API for other agents and languages, with tenants (see docs/serve.md)."""

from __future__ import annotations

from pathlib import Path

import click

from sandforge.runtime.errors import UsageError

DEFAULT_CONFIG = Path("server.yaml")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", type=click.IntRange(0, 65535), default=8700, show_default=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG,
              show_default=True, help="The server configuration: tenants, tokens (hashes), quotas.")  # fmt: skip
@click.option("--ssl-certfile", type=click.Path(dir_okay=False, path_type=Path), default=None, help="TLS certificate.")
@click.option("--ssl-keyfile", type=click.Path(dir_okay=False, path_type=Path), default=None, help="TLS private key.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning")
@click.option("--init-from", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="First start: copy this configuration to --config if that is missing, and make one token per "
                   "tenant without one into initial-tokens/ beside it (a container's entry point).")  # fmt: skip
def command(
    host: str,
    port: int,
    config_path: Path,
    ssl_certfile: Path | None,
    ssl_keyfile: Path | None,
    log_level: str,
    init_from: Path | None,
) -> None:
    """Serve the HTTP API (POST /v1/exec, /v1/agents/ROLE/METHOD, ...) until SIGINT/SIGTERM."""
    from sandforge.runtime.service.server import build_server
    from sandforge.runtime.service.tenants import load_server_config

    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together")
    if init_from is not None:
        from sandforge.runtime.deploy.first_start import TOKENS_DIR, init_from_template

        if given := init_from_template(init_from, config_path):
            where = config_path.parent / TOKENS_DIR
            click.echo(f"sandforge serve: first start: tokens for {', '.join(given)} are in {where}", err=True)
    config = load_server_config(config_path)
    if not config.tenants:
        raise UsageError(f"{config_path} lists no tenants", hint="see docs/serve.md")
    server = build_server(
        config,
        host=host,
        port=port,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        log_level=log_level,
        config_path=config_path,
    )
    scheme = "https" if ssl_certfile else "http"
    click.echo(f"sandforge serve: {scheme}://{host}:{port} ({len(config.tenants)} tenants)", err=True)
    server.run()
