"""`sandforge tokens`: API tokens of the tenants in server.yaml (stored as hashes; a token is shown once)."""

from __future__ import annotations

from pathlib import Path

import click

from sandforge.runtime.cli.common import SandforgeGroup
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import exclusive
from sandforge.runtime.service.tenants import TENANT_NAME_PATTERN, edit_token_hashes, hash_token, new_token

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("server.yaml"),
    show_default=True, help="The server configuration file.",
)  # fmt: skip


@click.group("tokens", cls=SandforgeGroup)
def command() -> None:
    """Create and revoke the API tokens of `sandforge serve` tenants (a running server sees the change)."""


@command.command("create")
@click.argument("tenant")
@CONFIG_OPTION
@click.option("--new-tenant", is_flag=True, help="Add TENANT (and the file) if it is not there.")
@JSON_OPTION
def create(tenant: str, config_path: Path, new_tenant: bool, as_json: bool) -> None:
    """Print a new token for TENANT, once: only its hash is stored in the configuration."""
    import re

    if not re.fullmatch(TENANT_NAME_PATTERN, tenant):
        raise UsageError(f"invalid tenant name {tenant!r} (lowercase letters, digits, - and _; a letter first)")
    token = new_token()
    digest = hash_token(token)
    with exclusive(config_path):
        edit_token_hashes(config_path, tenant=tenant, add=digest, create=new_tenant)
    if as_json:
        emit_json({"tenant": tenant, "token": token, "token_hash": digest})
    else:
        click.echo(token)


@command.command("revoke")
@click.argument("token")
@CONFIG_OPTION
@JSON_OPTION
def revoke(token: str, config_path: Path, as_json: bool) -> None:
    """Revoke TOKEN (the token itself, or its sha256:... hash as stored)."""
    digest = token if token.startswith("sha256:") else hash_token(token)
    with exclusive(config_path):
        tenant = edit_token_hashes(config_path, remove=digest)
    if tenant is None:
        raise UsageError("no tenant has this token")
    if as_json:
        emit_json({"tenant": tenant, "revoked": digest})
    else:
        click.echo(f"revoked a token of tenant {tenant}")
