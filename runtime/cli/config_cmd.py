"""`sandforge config`: every setting, its value and where it came from (flag-free view of the environment,
the configuration file and the defaults)."""

from __future__ import annotations

import os

import click

from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.cli.settings import ENV_ONLY, effective


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """Show every SANDFORGE_* setting: its value and source (environment, configuration file or default)."""
    path, applied = ctx.meta.get("sandforge.config", (None, []))
    rows = effective(os.environ, set(applied))
    if as_json:
        emit_json({"config_file": str(path) if path else None, "settings": rows, "environment_only": list(ENV_ONLY)})
        return
    click.echo(f"configuration file: {path or '(none found)'}")
    width = max(len(r["key"] or "") for r in rows)
    for r in rows:
        value = r["value"] if r["value"] is not None else f"(default: {r['default']})"
        source = "" if r["source"] == "default" else f"  [{r['source']}]"
        click.echo(f"{r['key']:<{width}}  {value}{source}")
