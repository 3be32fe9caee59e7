"""`sandforge cleanup [--apply] [--json]`: what sandforge processes that died left behind.

A host killed with SIGKILL cannot clean up: work directories, hand-off directories, containers and OCI
bundles stay. Any backend starting removes those of dead owners in the background; this command lists them
(a dry run by default) and removes them with ``--apply``. See ``sandbox/leftovers.py``.
"""

from __future__ import annotations

import json

import click

from sandforge.runtime.errors import SandforgeError


@click.command("cleanup")
@click.option("--apply", "apply_", is_flag=True, help="Remove them (default: only list what would go).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--no-containers", is_flag=True, help="Only files: do not ask the container engines.")
def command(apply_: bool, as_json: bool, no_containers: bool) -> None:
    """List (or remove, with --apply) the sandboxes and files of sandforge processes that are gone."""
    from sandforge.sandbox import leftovers

    found = leftovers.reap(apply=apply_, containers=not no_containers)
    failed = [item for item in found if item.error]
    if as_json:
        click.echo(json.dumps({"applied": apply_, "leftovers": [item.as_dict() for item in found]},
                              separators=(",", ":")))  # fmt: skip
    else:
        for item in found:
            state = "removed" if item.removed else f"NOT removed: {item.error}" if item.error else "would remove"
            click.echo(f"{state}: {item.kind} {item.name} in {item.where} (owner {item.owner}, gone)")
        if not found:
            click.echo("nothing left behind by dead sandforge processes")
        elif not apply_:
            click.echo(f"{len(found)} leftover(s); run `sandforge cleanup --apply` to remove them")
    if failed:
        raise SandforgeError(f"{len(failed)} leftover(s) could not be removed")
