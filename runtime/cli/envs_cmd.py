"""`sandforge envs`: the environments built for tool programs' third-party packages (docs/environments.md)."""

from __future__ import annotations

import contextlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from sandforge.runtime.cli.common import SandforgeGroup, load_policy_option, policy_options
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.environments import EnvironmentStore, Manifest, manifest_of, probe
from sandforge.runtime.environments import prune as pruning
from sandforge.runtime.environments.errors import EnvironmentFailure, InvalidDependencyManifest
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files.read import read_user_file
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store import ToolStore

MAX_PROGRAM_BYTES = 4 * 1024 * 1024


def environments_root(state_dir: Path | None = None) -> Path:
    """Where environments live: ``<state dir>/environments`` (beside the tool store, one file system)."""
    return resolve_state_dir(state_dir) / "environments"


def _store(ctx: click.Context) -> EnvironmentStore:
    store = ctx.find_object(EnvironmentStore)
    assert store is not None
    return store


@click.group("envs", cls=SandforgeGroup)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Default: SANDFORGE_STATE_DIR or the user state directory.")  # fmt: skip
@click.pass_context
def command(ctx: click.Context, state_dir: Path | None) -> None:
    """Environments: third-party packages built on the host for tool programs, mounted read-only."""
    ctx.obj = EnvironmentStore(environments_root(state_dir))
    ctx.meta["state_dir"] = state_dir


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Ready environments, newest first."""
    records = _store(ctx).ready()
    if as_json:
        emit_json({"environments": [r.model_dump(mode="json") for r in records]})
        return
    if not records:
        click.echo("no environments")
        return
    for r in records:
        when = datetime.fromtimestamp(r.created_at, UTC).strftime("%Y-%m-%d %H:%M")
        packages = " ".join(f"{p.name}=={p.version}" for p in r.spec.pins)
        click.echo(f"{r.env_id}  {when}  {r.size_bytes / 1024 / 1024:6.1f} MB  {r.spec.target.version}  {packages}")


@command.command("show")
@click.argument("env_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def show(ctx: click.Context, env_id: str, as_json: bool) -> None:
    """One environment: identity, pins, source, size, what it provides."""
    store = _store(ctx)
    record = store.record(env_id)
    if record is None:
        raise UsageError(f"no ready environment {env_id!r}", hint="`sandforge envs list` shows them")
    if as_json:
        emit_json({**record.model_dump(mode="json"), "site": str(store.site(env_id))})
        return
    spec = record.spec
    click.echo(f"environment {record.env_id}")
    click.echo(f"  path       {store.site(env_id)}")
    click.echo(f"  target     {spec.target.label()}")
    click.echo(f"  source     {spec.source.describe()}")
    click.echo(f"  manifest   {', '.join(spec.manifest.lines())}")
    for pin in spec.pins:
        modules = ", ".join(record.provides.get(pin.name, ()))
        click.echo(f"  pin        {pin.name}=={pin.version}  ({len(pin.hashes)} hash(es); imports {modules or '-'})")
    click.echo(f"  size       {record.size_bytes} bytes in {record.files} files ({record.unshared_bytes} not shared)")
    click.echo(f"  built      in {record.install_ms + record.compile_ms:.0f} ms with {record.uv_version or 'uv'}")


@command.command("build")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@policy_options()
@click.option("--python", "python", default=None, help="The sandbox's interpreter (default: this one).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def build(
    ctx: click.Context, file: Path, policies: tuple[Path, ...], no_default: bool, python: str | None, as_json: bool
) -> None:
    """Build (or find) the environment FILE.py declares in its `# /// script` block.

    Exit status: 0 ready, 1 a failure to prepare it (its kind is printed), 2 a bad file or manifest."""
    source = read_user_file(file, limit=MAX_PROGRAM_BYTES, what="program").decode("utf-8", errors="replace")
    policy = load_policy_option(policies, no_default)
    store = _store(ctx)
    store.python = python or store.python
    try:
        manifest = manifest_of(source)
        if not manifest:
            raise InvalidDependencyManifest(f"{file} declares no dependency (no `# /// script` dependencies)")
        prepared = store.prepare(manifest, policy.dependencies, probe(python))
    except EnvironmentFailure as exc:
        if as_json:
            emit_json({"ok": False, "error_type": exc.kind, "message": str(exc)})
        else:
            click.echo(f"error: {exc.kind}: {exc}", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        emit_json({"ok": True, **prepared.log_fields(), "site": str(prepared.site)})
        return
    state = "ready (cached)" if prepared.cache_hit else "built"
    click.echo(f"{prepared.env_id}  {state} in {prepared.prepare_ms:.0f} ms  {prepared.site}")


@command.command("prune")
@click.option("--apply", "apply_", is_flag=True, help="Remove them (default: only list what would go).")
@click.option("--force", is_flag=True, help="Also remove environments persisted artifacts use.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def prune(ctx: click.Context, apply_: bool, force: bool, as_json: bool) -> None:
    """Remove unused environments and leftovers of killed builds (a dry run unless --apply)."""
    store = _store(ctx)
    entries = pruning.plan(store, _manifests_in_use(ctx.meta.get("state_dir")), force=force)
    removed = pruning.apply(store, entries) if apply_ else 0
    if as_json:
        emit_json({"applied": apply_, "removed": removed, "entries": [e.model_dump(mode="json") for e in entries]})
        return
    for e in entries:
        verb = "keep" if e.kept else ("removed" if apply_ else "would remove")
        click.echo(f"{verb:12}  {e.what:11}  {e.name}  {e.size_bytes / 1024 / 1024:.1f} MB  {e.why}")
    if not entries:
        click.echo("nothing to prune")
    elif not apply_:
        click.echo("dry run: pass --apply to remove")


def _manifests_in_use(state_dir: Path | None) -> list[Manifest]:
    """The manifests of every retained generation of every persisted artifact (PEP 723 block plus the
    stored ``dependencies``). Artifacts whose manifest is no longer valid use no environment."""
    store = ToolStore(state_dir)
    manifests: list[Manifest] = []
    for entry in store.list_tools():
        for method in entry.methods:
            for artifact in store.history(entry.role, method):
                with contextlib.suppress(InvalidDependencyManifest):
                    manifest = manifest_of(artifact.code, artifact.dependencies)
                    if manifest:
                        manifests.append(manifest)
    return manifests
