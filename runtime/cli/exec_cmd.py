"""`sandforge exec`: validate a tool program with the active policy and run it in a fresh sandbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from runtime.errors import UsageError
from runtime.fsio import atomic_write_json
from runtime.gate import guarded_execute
from runtime.guardrails import default_policy, load_policy
from runtime.guardrails.engine import source_text
from sandbox import BACKENDS, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig


def _json_arg(text: str, flag: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not valid JSON: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(value, kind):
        raise UsageError(f"{flag} must be a JSON {'array' if kind is list else 'object'}")
    return value


def _read_context(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read context file {path}: {exc}") from exc
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}:{exc.colno}: context file is not valid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise UsageError(f"{path}: the context must be a JSON object")
    return value


def outcome_json(outcome: ExecutionOutcome) -> dict[str, Any]:
    """The stable `--json` shape of an execution outcome."""
    metadata = dict(outcome.metadata)
    metadata.update(
        duration_s=outcome.duration_s,
        usage=outcome.usage.model_dump(mode="json"),
        backend=outcome.backend,
        protections=outcome.protections,
        stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated,
    )
    return {
        "status": outcome.status,
        "value": outcome.value,
        "context": outcome.context,
        "error_type": outcome.error_type.value if outcome.error_type else None,
        "error_message": outcome.error_message,
        "retriable": outcome.retriable,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "metadata": metadata,
    }


def _print_text(outcome: ExecutionOutcome, committed: Path | None) -> None:
    if outcome.stdout:
        click.echo(outcome.stdout, nl=not outcome.stdout.endswith("\n"))
    if outcome.ok:
        click.echo(f"ok: {json.dumps(outcome.value, ensure_ascii=False)}")
        click.echo(f"context: {json.dumps(outcome.context, ensure_ascii=False)}")
        if committed:
            click.echo(f"committed to {committed}")
    else:
        retriable = " (retriable)" if outcome.retriable else ""
        click.echo(f"error [{outcome.error_type}]{retriable}: {outcome.error_message}", err=True)
        for v in outcome.metadata.get("violations", []):
            loc = v.get("location") or {}
            click.echo(
                f"  line {loc.get('line')}: {v['violation_type']} ({v['classification']}): {v['message']}", err=True
            )
            if v.get("required_correction"):
                click.echo(f"    fix: {v['required_correction']}", err=True)
    if outcome.stderr:
        click.echo(outcome.stderr, err=True, nl=not outcome.stderr.endswith("\n"))
    if not outcome.backend:
        click.echo("[not executed: rejected before anything ran]", err=True)
        return
    usage = outcome.usage
    click.echo(
        f"[{outcome.backend or '-'} {outcome.duration_s * 1000:.1f} ms, cpu {usage.cpu_time_s * 1000:.1f} ms, "
        f"peak {usage.peak_memory_mb:.1f} MB]",
        err=True,
    )


@click.command("exec")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="Default: SANDFORGE_BACKEND or subprocess.")
@click.option("--context", "context_path", type=click.Path(dir_okay=False, path_type=Path), help="JSON object file.")
@click.option("--commit", is_flag=True, help="Write the new context back to --context (atomically, only on ok).")
@click.option("--args", "args_json", default="[]", help="Positional arguments as a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments as a JSON object.")
@click.option("--timeout", type=float, default=None, help="Wall-clock limit in seconds.")
@click.option("--memory", type=int, default=None, help="Memory limit in MB.")
@click.option("--policy", "policy_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Policy directory layered over the default (repeatable).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(
    file: Path,
    backend: str | None,
    context_path: Path | None,
    commit: bool,
    args_json: str,
    kwargs_json: str,
    timeout: float | None,
    memory: int | None,
    policy_dirs: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Validate FILE (a tool program body) with the policy, run it in a fresh sandbox, print the outcome.

    Exit status: 0 ok, 1 error outcome, 2 usage error.
    """
    if commit and context_path is None:
        raise UsageError("--commit needs --context FILE to write to")
    try:
        code = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from exc
    context = _read_context(context_path)
    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    config = SandboxConfig.from_env(pool_size=0, **({"backend": backend} if backend else {}))
    overrides: dict[str, Any] = {}
    if timeout is not None:
        overrides["timeout_s"] = timeout
    if memory is not None:
        overrides["memory_mb"] = memory
    try:
        limits = Limits(**{**config.limits.model_dump(), **overrides})
        request = ExecutionRequest(code=source_text(code), context=context, args=args, kwargs=kwargs, limits=limits)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UsageError(f"invalid {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from exc
    policy = load_policy([*default_policy().sources, *policy_dirs]) if policy_dirs else default_policy()
    config = config.model_copy(update={"limits": limits})
    with Sandbox(config) as sb:
        outcome, _ = guarded_execute(sb, request, policy=policy)
    committed = None
    if commit and outcome.ok and context_path is not None:
        atomic_write_json(context_path, outcome.context)
        committed = context_path
    if as_json:
        click.echo(json.dumps(outcome_json(outcome), ensure_ascii=False, indent=2))
    else:
        _print_text(outcome, committed)
    sys.exit(0 if outcome.ok else 1)
