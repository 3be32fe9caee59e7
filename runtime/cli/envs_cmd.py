"""`sandforge envs`: the environments built for tool programs' third-party packages (docs/environments.md)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.common import SandforgeGroup, load_policy_option, policy_options
from sandforge.runtime.cli.output import emit_json, rfc3339
from sandforge.runtime.cli.progress import Steps
from sandforge.runtime.environments import EnvironmentRecord, EnvironmentStore, manifest_of, probe
from sandforge.runtime.environments import prune as pruning
from sandforge.runtime.environments.errors import DependencyInstallFailed, EnvironmentFailure, InvalidDependencyManifest
from sandforge.runtime.environments.target import SandboxTarget
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files.read import read_user_file
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store import ToolStore
from sandforge.sandbox.config import BACKENDS

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


def _record_json(record: EnvironmentRecord) -> dict[str, Any]:
    """A record as JSON output shows it: times in RFC 3339 UTC, like every JSON output (the record on disk keeps
    seconds since the epoch)."""
    return {**record.model_dump(mode="json"), "created_at": rfc3339(record.created_at)}


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Ready environments, newest first."""
    records = _store(ctx).ready()
    if as_json:
        emit_json({"environments": [_record_json(r) for r in records]})
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
    """One environment (ENV_ID: its id or a unique prefix): identity, pins, source, size, what it provides,
    which persisted artifacts use it."""
    store = _store(ctx)
    env_id = pruning.resolve_id(store, env_id)
    record = store.record(env_id)
    if record is None:
        raise UsageError(f"no ready environment {env_id!r}", hint="`sandforge envs list` shows them")
    users = sorted(_env_ids_in_use(ctx.meta.get("state_dir")).get(env_id, ()))
    if as_json:
        emit_json({**_record_json(record), "site": str(store.site(env_id)), "used_by": users})
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
    click.echo(f"  bytecode   compiled by {record.compiled_by or 'the host'}")
    click.echo(f"  used by    {', '.join(users) or 'no persisted artifact'}")


@command.command("build")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@policy_options()
@click.option("--python", "python", default=None, help="The sandbox's interpreter (default: this one).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Build for the interpreter this backend runs programs on (containers: the image's).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def build(
    ctx: click.Context, file: Path, policies: tuple[Path, ...], no_default: bool, python: str | None,
    backend: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Build (or find) the environment FILE.py declares in its `# /// script` block.

    Exit status: 0 ready, 1 a failure to prepare it (its kind is printed), 2 a bad file or manifest."""
    if python and backend:
        raise UsageError("--python and --backend name the interpreter twice: give one")
    source = read_user_file(file, limit=MAX_PROGRAM_BYTES, what="program").decode("utf-8", errors="replace")
    policy = load_policy_option(policies, no_default)
    store = _store(ctx)
    store.python = python or store.python
    try:
        manifest = manifest_of(source)
        if not manifest:
            raise InvalidDependencyManifest(f"{file} declares no dependency (no `# /// script` dependencies)")
        target = _target(store, python, backend)
        with Steps("environment build", quiet=as_json) as shown:
            prepared = store.prepare(manifest, policy.dependencies, target, progress=shown.step)
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


def _target(store: EnvironmentStore, python: str | None, backend: str | None) -> SandboxTarget:
    """The interpreter to build for: ``backend``'s (as ``sandforge exec --backend`` would run it, so its next
    run is a cache hit), else the one at ``python`` (default: this one)."""
    if backend is None:
        return probe(python)
    from sandforge.runtime.agent.environment import Environments  # only here: `envs list` starts no sandbox layer
    from sandforge.sandbox import Sandbox, SandboxConfig

    config = SandboxConfig.from_env(pool_size=0, backend=backend)
    with Sandbox(config) as sandbox:
        try:
            return Environments(store.root, store=store).target(sandbox, config.backend)
        except EnvironmentFailure:
            raise
        except Exception as exc:  # the engine down, no image: the kind a run would get
            raise DependencyInstallFailed(f"cannot describe the {backend} backend's interpreter: {exc}") from None


@command.command("prune")
@click.argument("env_ids", nargs=-1, metavar="[ENV_ID]...")
@click.option("--apply", "apply_", is_flag=True, help="Remove them (default: only list what would go).")
@click.option("--force", is_flag=True, help="Also remove environments persisted artifacts use.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def prune(ctx: click.Context, env_ids: tuple[str, ...], apply_: bool, force: bool, as_json: bool) -> None:
    """Remove unused environments and leftovers of killed builds (a dry run unless --apply).

    With ENV_IDs (ids or unique prefixes), only those environments. An environment is used when a retained
    generation of a persisted artifact stores its id (its EnvironmentSpec); such one is kept unless --force."""
    store = _store(ctx)
    only = {pruning.resolve_id(store, text) for text in env_ids} if env_ids else None
    _prune(ctx, store, only, apply_=apply_, force=force, as_json=as_json)


@command.command("remove")
@click.argument("env_ids", nargs=-1, required=True, metavar="ENV_ID...")
@click.option("--force", is_flag=True, help="Also when a persisted artifact uses it (it is rebuilt on its next use).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def remove(ctx: click.Context, env_ids: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Remove the environments ENV_ID... (ids or unique prefixes) now; one a persisted artifact uses is kept
    unless --force. Exit status 1 when one was kept."""
    store = _store(ctx)
    only = {pruning.resolve_id(store, text) for text in env_ids}
    kept = _prune(ctx, store, only, apply_=True, force=force, as_json=as_json)
    if kept:
        sys.exit(1)


def _prune(
    ctx: click.Context, store: EnvironmentStore, only: set[str] | None, *, apply_: bool, force: bool, as_json: bool
) -> int:
    """Plan, apply when asked, print; the number of environments kept."""
    entries = pruning.plan(store, _env_ids_in_use(ctx.meta.get("state_dir")), force=force, only=only)
    removed = pruning.apply(store, entries) if apply_ else 0
    kept = sum(1 for e in entries if e.kept)
    if as_json:
        emit_json({"applied": apply_, "removed": removed, "entries": [e.model_dump(mode="json") for e in entries]})
        return kept
    for e in entries:
        verb = "keep" if e.kept else ("removed" if apply_ else "would remove")
        click.echo(f"{verb:12}  {e.what:11}  {e.name}  {e.size_bytes / 1024 / 1024:.1f} MB  {e.why}")
    if not entries:
        click.echo("nothing to prune")
    elif not apply_:
        click.echo("dry run: pass --apply to remove")
    return kept


def _env_ids_in_use(state_dir: Path | None) -> dict[str, list[str]]:
    """env id -> the persisted artifacts (``role.method``) whose retained generations store it."""
    store = ToolStore(state_dir)
    users: dict[str, list[str]] = {}
    for entry in store.list_tools():
        for method in entry.methods:
            for artifact in store.history(entry.role, method):
                if artifact.environment is not None:
                    who = users.setdefault(artifact.environment.env_id, [])
                    if f"{entry.role}.{method}" not in who:
                        who.append(f"{entry.role}.{method}")
    return users
