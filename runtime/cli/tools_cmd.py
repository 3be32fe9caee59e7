"""`sandforge tools`: inspect and maintain the ToolStore (registry, artifacts, health, pattern memory)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from sandforge.runtime.cli.common import SandforgeGroup, load_policy_option, policy_options
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.store import (
    MethodArtifact,
    ToolNotFoundError,
    ToolStore,
    assess_health,
    reuse_allowed,
    summarize,
)
from sandforge.runtime.store.errors import StoreIOError

if TYPE_CHECKING:
    from sandforge.runtime.guardrails.policy import Policy

P = ParamSpec("P")
R = TypeVar("R")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _io_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """OSErrors (permissions, full disk) become one-line typed errors, never tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise StoreIOError(f"{exc.filename or 'store'}: {exc.strerror or exc}") from exc

    return wrapper


def _cell(value: object, width: int = 48) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = _CONTROL.sub("?", str(value))
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _emit_json(payload: Any) -> None:
    emit_json(payload, default=str)


def _store(ctx: click.Context) -> ToolStore:
    store = ctx.find_object(ToolStore)
    assert store is not None
    return store


def _failures(a: MethodArtifact) -> str:
    return f"{a.failure_count} ({a.intrinsic_failure_count}/{a.extrinsic_failure_count}/{a.adaptive_failure_count})"


@click.group("tools", cls=SandforgeGroup)
@click.option(
    "--store",
    "state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory holding tools/ (default: $SANDFORGE_STATE_DIR, else the user state dir).",
)
@click.pass_context
def command(ctx: click.Context, state_dir: Path | None) -> None:
    """Inspect and maintain the persistent ToolStore."""
    ctx.obj = ToolStore(state_dir)
    ctx.meta["state_dir"] = state_dir


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """Every tool in the registry."""
    store = _store(ctx)
    tools = store.list_tools()
    if as_json:
        _emit_json([t.model_dump(mode="json") for t in tools])
        return
    if not tools:
        click.echo(f"no tools in {store.tools_dir}")
        return
    rows = [
        (t.role, len(t.methods), t.usage_count, t.success_count, t.failure_count, t.last_used_at, t.purpose)
        for t in tools
    ]
    click.echo(_table(["ROLE", "METHODS", "USES", "OK", "FAILED", "LAST USED", "PURPOSE"], rows))
    click.echo(f"{len(tools)} tool(s) in {store.tools_dir}")


@command.command("show")
@click.argument("role")
@click.argument("method", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--code/--no-code", default=True, help="Print the method's code (default: yes).")
@click.pass_context
@_io_errors
def show_cmd(ctx: click.Context, role: str, method: str | None, as_json: bool, code: bool) -> None:
    """A tool's contract and methods, or one method's current artifact."""
    store = _store(ctx)
    entry = store.get_tool(role)
    if method is None:
        if entry is None:
            raise ToolNotFoundError(f"no tool {role!r} in the store", hint="see `sandforge tools list`")
        report = store.health_report([role])
        if as_json:
            _emit_json(
                {
                    "tool": entry.model_dump(mode="json"),
                    "methods": [h.model_dump(mode="json", exclude={"artifact"}) for h in report],
                }
            )
            return
        fields: list[tuple[str, object]] = [
            ("role", entry.role),
            ("purpose", entry.purpose),
            ("deliverable", json.dumps(entry.deliverable, ensure_ascii=False)),
            ("acceptance", json.dumps(entry.acceptance, ensure_ascii=False)),
            ("failure_policy", json.dumps(entry.failure_policy, ensure_ascii=False)),
            ("contract", entry.contract_fingerprint[:16] if entry.contract_fingerprint else None),
            ("created", entry.created_at),
            ("last used", entry.last_used_at),
            ("usage", f"{entry.usage_count} ({entry.success_count} ok, {entry.failure_count} failed)"),
            ("capabilities", ", ".join(entry.capabilities) or None),
            ("directory", store.paths.role_dir(role)),
        ]
        for label, value in fields:
            click.echo(f"{label:>15}: {_cell(value, 200)}")
        if report:
            click.echo("")
            rows = [(h.method_name, h.generation, h.health, h.reusable, h.checksum_ok, h.status) for h in report]
            click.echo(_table(["METHOD", "GEN", "HEALTH", "REUSABLE", "CHECKSUM OK", "STATUS"], rows))
        return

    lookup = store.lookup(role, method)
    art = lookup.artifact
    if art is None:
        extra = f" (file was corrupt: {lookup.reason})" if lookup.reason else ""
        raise ToolNotFoundError(f"no stored artifact for {role!r} method {method!r}{extra}")
    reusable, why = reuse_allowed(art, method, store.policy.dynamic_methods)
    health = assess_health(art, policy=store.policy)
    if as_json:
        payload = art.model_dump(mode="json", exclude=set() if code else {"code"})
        payload |= {"checksum_ok": art.checksum_ok(), "health": health.value, "reusable": reusable}
        _emit_json(payload)
        return
    details: list[tuple[str, object]] = [
        ("role", art.role),
        ("method", art.method_name),
        ("generation", art.generation),
        ("source", art.program_source.value),
        ("created", art.created_at),
        ("last used", art.last_used_at),
        ("runtime", art.runtime_version),
        ("prompt version", art.prompt_version),
        ("model", art.model),
        ("checksum", "ok" if art.checksum_ok() else "MISMATCH (will not be executed)"),
        ("contract", art.contract_fingerprint[:16] if art.contract_fingerprint else None),
        ("health", f"{health.value} (intrinsic failure rate {art.recent_failure_rate:.0%})"),
        ("successes", art.success_count),
        ("failures", f"{_failures(art)} intrinsic/extrinsic/adaptive"),
        ("repairs", f"{art.repair_count_since_regen} since regeneration"),
        ("last failure", f"{art.last_failure_class}: {art.last_failure_reason}" if art.last_failure_class else None),
        ("cacheable", art.cacheable if art.cacheable is not None else "legacy (unknown)"),
        ("cacheability", art.cacheability_reason),
        ("reusable", f"{_cell(reusable)}: {why}"),
        ("input sensitive", art.input_sensitive),
        ("capabilities", ", ".join(art.capabilities) or None),
        ("dependencies", ", ".join(art.dependencies) or None),
    ]
    for label, value in details:
        click.echo(f"{label:>15}: {_cell(value, 200)}")
    if code:
        click.echo("")
        click.echo(art.code)


def _environments(ctx: click.Context, policy: Policy, build: bool) -> Callable[..., Any]:
    """Each artifact's environment state (None: it declares none), under the policy given."""
    from sandforge.runtime.environments.builder import EnvironmentStore
    from sandforge.runtime.environments.status import environment_status
    from sandforge.runtime.state_dir import resolve_state_dir

    envs = EnvironmentStore(resolve_state_dir(ctx.meta.get("state_dir")) / "environments")

    def status(art: MethodArtifact | None) -> Any:
        if art is None or art.environment is None:
            return None
        return environment_status(art.environment, envs, policy.dependencies, build=build)

    return status


def _env_cell(status: Any) -> str:
    if status is None:
        return "-"
    return f"{status.state} {status.env_id[:12]}" + (f" ({status.kind})" if status.kind else "")


@command.command("health")
@click.option("--role", "roles", multiple=True, help="Only this role (repeatable).")
@policy_options()
@click.option("--build-envs", "build", is_flag=True, help="Build missing environments to prove they still can be.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def health_cmd(ctx: click.Context, roles: tuple[str, ...], policies: tuple[Path, ...], no_default: bool,
               build: bool, as_json: bool) -> None:  # fmt: skip
    """Health of every stored method artifact, and whether its environment can still be built.

    Exit status 1 when an artifact's environment cannot be built (refused by the policy, or a build failed):
    it is repaired like a stale artifact on its next call."""
    store = _store(ctx)
    report = store.health_report(roles or None)
    env_of = _environments(ctx, load_policy_option(policies, no_default), build)
    envs = [env_of(h.artifact) for h in report]
    broken = any(e is not None and not e.buildable for e in envs)
    if as_json:
        _emit_json([
            {**h.model_dump(mode="json", exclude={"artifact"}),
             "environment": e.model_dump(mode="json") if e is not None else None}
            for h, e in zip(report, envs, strict=True)
        ])  # fmt: skip
        ctx.exit(1 if broken else 0)
    if not report:
        click.echo("no stored artifacts")
        return
    rows: list[tuple[object, ...]] = []
    for h, env in zip(report, envs, strict=True):
        a = h.artifact
        if a is None:
            rows.append((h.role, h.method_name, None, h.status.value, None, None, None, None, None, None, None))
            continue
        rows.append(
            (
                h.role,
                h.method_name,
                h.generation,
                h.health,
                a.success_count,
                _failures(a),
                f"{a.recent_failure_rate:.0%}",
                a.repair_count_since_regen,
                h.reusable,
                "ok" if h.checksum_ok else "MISMATCH",
                _env_cell(env),
            )
        )
    headers = ["ROLE", "METHOD", "GEN", "HEALTH", "OK", "FAIL (I/E/A)", "RATE", "REPAIRS", "REUSABLE", "CHECKSUM",
               "ENV"]  # fmt: skip
    click.echo(_table(headers, rows))
    for env in envs:
        if env is not None and not env.buildable:
            click.echo(f"environment {env.env_id} cannot be built: {env.kind}: {env.detail}", err=True)
    ctx.exit(1 if broken else 0)


@command.command("history")
@click.argument("role")
@click.argument("method")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def history_cmd(ctx: click.Context, role: str, method: str, as_json: bool) -> None:
    """Retained generations of a method (current first)."""
    store = _store(ctx)
    generations = store.history(role, method)
    if not generations:
        raise ToolNotFoundError(f"no stored artifact for {role!r} method {method!r}")
    if as_json:
        _emit_json(
            [
                a.model_dump(mode="json", exclude={"code"}) | {"current": i == 0, "checksum_ok": a.checksum_ok()}
                for i, a in enumerate(generations)
            ]
        )
        return
    rows = [
        (
            a.generation,
            "*" if i == 0 else "",
            a.program_source.value,
            a.created_at,
            a.last_used_at,
            a.success_count,
            _failures(a),
            a.repair_count_since_regen,
            a.cacheable,
            "ok" if a.checksum_ok() else "MISMATCH",
        )
        for i, a in enumerate(generations)
    ]
    headers = [
        "GEN",
        "CURRENT",
        "SOURCE",
        "CREATED",
        "LAST USED",
        "OK",
        "FAIL (I/E/A)",
        "REPAIRS",
        "CACHEABLE",
        "CHECKSUM",
    ]
    click.echo(_table(headers, rows))


@command.command("rollback")
@click.argument("role")
@click.argument("method")
@click.option("--to", "to", type=click.IntRange(min=1), default=None, help="Generation to restore (default: previous).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def rollback_cmd(ctx: click.Context, role: str, method: str, to: int | None, as_json: bool) -> None:
    """Make an earlier retained generation current again (reversible: roll back again to undo)."""
    store = _store(ctx)
    before = store.history(role, method)
    restored = store.rollback(role, method, to=to)
    if as_json:
        _emit_json({"role": role, "method": method, "from_generation": before[0].generation,
                    "to_generation": restored.generation,
                    "artifact": restored.model_dump(mode="json", exclude={"code"})})  # fmt: skip
        return
    click.echo(f"{role}.{method}: generation {before[0].generation} -> {restored.generation}")


@command.command("patterns")
@click.option("--role", default=None, help="Only this role.")
@click.option("--method", default=None, help="Only calls of this method.")
@click.option("--window", type=click.IntRange(min=1), default=5, show_default=True, help="Last N calls.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def patterns_cmd(ctx: click.Context, role: str | None, method: str | None, window: int, as_json: bool) -> None:
    """Capability patterns seen in recent generated calls (pattern memory)."""
    store = _store(ctx)
    roles = [role] if role is not None else store.patterns.roles()
    summaries = [summarize(r, store.patterns.events(r), method_name=method, window=window) for r in roles]
    if as_json:
        _emit_json(
            [s.model_dump(mode="json") | {"tools": store.capability_index(exclude_role=s.role)} for s in summaries]
        )
        return
    if not any(s.calls for s in summaries):
        click.echo("no recorded patterns" + (f" for role {role!r}" if role is not None else ""))
        return
    for s in summaries:
        if not s.calls:
            continue
        index = store.capability_index(exclude_role=s.role)
        scope = f"{s.method_name} calls" if s.method_name else "calls"
        click.echo(f"{_cell(s.role, 80)}: last {s.calls} {scope}")
        rows = [(c.label, f"{c.count} of {s.calls}", ", ".join(index.get(c.label, [])) or None) for c in s.counts]
        click.echo(
            _table(["  CAPABILITY", "SEEN", "TOOL"], [(f"  {r[0]}", r[1], r[2]) for r in rows]) if rows else "  -"
        )


@command.command("prune")
@click.option(
    "--older-than",
    "days",
    type=click.FloatRange(min=0),
    default=90,
    show_default=True,
    help="Unused for this many days.",
)
@click.option("--apply", is_flag=True, help="Archive and remove them (default: dry run, change nothing).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_io_errors
def prune_cmd(ctx: click.Context, days: float, apply: bool, as_json: bool) -> None:
    """Tools unused for a while: listed (dry run), or archived under tools/.archive then removed."""
    store = _store(ctx)
    plan = store.prune(older_than_days=days, apply=apply)
    if as_json:
        _emit_json(plan.model_dump(mode="json"))
        return
    if not plan.candidates:
        click.echo(f"nothing unused since {_cell(plan.cutoff)}")
        return
    rows = [(c.role, c.last_activity, c.usage_count, ", ".join(c.methods)) for c in plan.candidates]
    click.echo(_table(["ROLE", "LAST ACTIVITY", "USES", "METHODS"], rows))
    if plan.applied:
        click.echo(f"archived {len(plan.candidates)} tool(s) into {plan.archive_dir}")
    else:
        click.echo(f"dry run: {len(plan.candidates)} tool(s) would be archived; add --apply to do it")
