"""`sandforge exec`: validate a tool program with the active policy and run it in a fresh sandbox."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import ValidationError

from sandforge.runtime.cli.common import load_policy_option, one_shot, policy_options
from sandforge.runtime.cli.exits import for_outcome
from sandforge.runtime.errors import InputFileMissing, UsageError
from sandforge.runtime.files import decode_json, encode_compact, read_user_file, write_user_file
from sandforge.runtime.files.jsontext import UTF8_BOM, one_line
from sandforge.runtime.files.transfer import commit_output_files, read_files_options
from sandforge.sandbox import BACKENDS, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig

if TYPE_CHECKING:  # the policy, the guardrails and the agent's run path load once the sandbox is starting
    from sandforge.runtime.agent.runs import RunClock
    from sandforge.runtime.guardrails import Policy, ValidationResult

log = logging.getLogger(__name__)


def _json_arg(text: str, flag: str, kind: type) -> Any:
    value = decode_json(text.encode("utf-8", "surrogateescape"), what=flag)
    if not isinstance(value, kind):
        raise UsageError(f"{flag} must be a JSON {'array' if kind is list else 'object'}")
    return value


def _read_context(path: Path | None, limit: int) -> dict[str, Any]:
    """The context file as a JSON object: missing or blank is ``{}``; bounded, strict, regular files only."""
    if path is None:
        return {}
    try:
        raw = read_user_file(path, limit=limit, what="context file")
    except InputFileMissing:
        return {}
    if not raw.strip() or raw.strip() == UTF8_BOM:
        return {}
    value = decode_json(raw, what=f"context file {path}")
    if not isinstance(value, dict):
        raise UsageError(f"{path}: the context must be a JSON object")
    return value


def output_limit(limits: Limits) -> int:
    """The most ``exec`` prints as one outcome: the message limit, plus the two output streams (each at
    most ``max_output_bytes``, up to 6x that as JSON escapes) and a little for the metadata."""
    return limits.max_message_bytes + 12 * limits.max_output_bytes + (1 << 16)


def _building_shown() -> Any:
    """The environments below the state directory, a first build's steps shown on standard error (issue 39)."""
    from sandforge.runtime.agent.environment import Environments
    from sandforge.runtime.cli.progress import notices

    return Environments(progress=notices("building the program's environment"))


def _print_text(outcome: ExecutionOutcome, committed: Path | None, limit: int) -> None:
    if outcome.stdout:
        click.echo(outcome.stdout, nl=not outcome.stdout.endswith("\n"))
    if outcome.ok:
        click.echo(b"ok: " + encode_compact(outcome.value, limit=limit, what="the value"))
        click.echo(b"context: " + encode_compact(outcome.context, limit=limit, what="the context"))
        if committed:
            click.echo(f"committed to {committed}")
    else:
        retriable = " (retriable)" if outcome.retriable else ""
        click.echo(f"error [{outcome.error_type}]{retriable}: {outcome.error_message}", err=True)
        if (event := outcome.security_event) is not None:
            click.echo(f"  security event: {event.source} {event.event}", err=True)
        for v in outcome.metadata.get("violations", []):
            line = (v.get("location") or {}).get("line")  # none for a refused manifest: not one line's fault
            where = f"line {line}: " if line is not None else ""
            click.echo(f"  {where}{v['violation_type']} ({v['classification']}): {v['message']}", err=True)
            if v.get("required_correction"):
                click.echo(f"    fix: {v['required_correction']}", err=True)
    _print_fetches(outcome.metadata.get("egress", []))
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


def _print_fetches(fetched: list[dict[str, Any]]) -> None:
    if fetched:  # the call log's reader (logs_cmd) loads only for a run that fetched
        from sandforge.runtime.cli.logs_cmd import egress_line

        for entry in fetched:
            click.echo(egress_line(entry), err=True)


def read_program(file: Path, limit: int) -> bytes:
    """The program: FILE, or standard input for ``-`` (bounded like a file)."""
    if str(file) != "-":
        return read_user_file(file, limit=limit, what="program")
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"the program on standard input is larger than {limit} bytes")
    return data


#: A field of the limits or the request, as the flag that sets it (messages name what the user typed).
FLAGS = {"timeout_s": "--timeout", "memory_mb": "--memory", "args": "--args", "kwargs": "--kwargs",
         "context": "--context", "code": "FILE"}  # fmt: skip


@click.command("exec")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="Default: SANDFORGE_BACKEND or subprocess.")
@click.option("--context", "context_path", type=click.Path(dir_okay=False, path_type=Path), help="JSON object file.")
@click.option("--commit", is_flag=True, help="Write the new context back to --context (atomically, only on ok).")
@click.option("--args", "args_json", default="[]", help="Positional arguments as a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments as a JSON object.")
@click.option("--timeout", type=float, default=None, help="Wall-clock limit in seconds.  [default: 5]")
@click.option("--memory", type=int, default=None, help="Memory limit in MB.  [default: 256]")
@policy_options()
@click.option(
    "--cluster", default=None, help="Run on a Ray cluster (HOST:PORT or ray://HOST:PORT); default: SANDFORGE_CLUSTER."
)
@click.option("--file", "file_args", multiple=True, metavar="NAME=PATH",
              help="An input file, read-only to the program as inputs/NAME (repeatable).")  # fmt: skip
@click.option("--files", "files_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Every file of DIR as an input file (inputs/NAME, not recursive).")  # fmt: skip
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the program's outputs/ files into DIR, all or nothing, only on ok.")  # fmt: skip
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
    policies: tuple[Path, ...],
    no_default: bool,
    cluster: str | None,
    file_args: tuple[str, ...],
    files_dir: Path | None,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """Validate FILE (a tool program body; - reads standard input) with the policy, run it in a fresh
    sandbox, print the outcome. Every run is recorded in the call log ($SANDFORGE_CALL_LOG, else
    <state dir>/logs/calls.jsonl) with source cli.

    Exit status: 0 ok; 1 the program failed (or a result over the message limit); 2 usage error or a refused
    input file; 3 rejected by the policy, recoverable; 4 rejected by the policy, terminal; 5 a timeout or
    resource limit ended it; 6 the sandbox is unavailable; 7 the context could not be written or locked (the
    file is left as it was); 130 interrupted.
    """
    one_shot()
    if commit and context_path is None:
        raise UsageError("--commit needs --context FILE to write to")
    config = SandboxConfig.from_env(
        pool_size=0, **({"backend": backend} if backend else {}), **({"cluster": cluster} if cluster else {})
    )
    overrides: dict[str, Any] = {}
    if timeout is not None:
        overrides["timeout_s"] = timeout
    if memory is not None:
        overrides["memory_mb"] = memory
    try:
        limits = Limits(**{**config.limits.model_dump(), **overrides})
    except ValidationError as exc:
        raise _invalid(exc) from None
    bound = limits.max_message_bytes
    code = read_program(file, bound)
    files = read_files_options(file_args, files_dir, limits)  # refused here, before any sandbox starts
    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    config = config.model_copy(update={"limits": limits})
    sandbox = Sandbox(config)
    try:
        # The subprocess backend's zygote starts now and comes up while this process imports and loads the
        # policy and judges the program (issue 39): nothing runs in it before the verdict, and `close` below
        # ends it on every path (a refusal, a bad policy or context file, an interrupt).
        sandbox.prestart()
        parts = {"code": code, "files": files, "args": args, "kwargs": kwargs}
        outcome, committed = _validate_and_run(
            sandbox, parts, context_path if commit else None, context_path,
            load_policy=lambda: load_policy_option(policies, no_default),
        )  # fmt: skip
    finally:
        sandbox.close()
    if out_dir is not None and outcome.ok and outcome.files:
        commit_output_files(out_dir, outcome.files)
        if not as_json:
            click.echo(f"wrote {len(outcome.files)} output files to {out_dir}", err=True)
    if as_json:
        from sandforge.runtime.service.models import exec_result  # the HTTP API's models: only for --json

        click.echo(encode_compact(exec_result(outcome), limit=output_limit(limits), what="the outcome"))
    else:
        _print_text(outcome, committed, bound)
    error_type = outcome.error_type.value if outcome.error_type else None
    sys.exit(for_outcome(outcome.ok, error_type, outcome.metadata.get("verdict")))


def _validate_and_run(
    sandbox: Sandbox, parts: dict[str, Any], commit_to: Path | None, context_path: Path | None,
    load_policy: Callable[[], Policy],
) -> tuple[ExecutionOutcome, Path | None]:  # fmt: skip
    """The policy loaded, the program (``parts``: its code, files, args, kwargs) judged and run in ``sandbox``
    (which the caller closes), the run in the call log, the context committed to ``commit_to`` (None: not
    asked); returns the outcome and the context file written (None: none)."""
    from sandforge.runtime.agent.egress import StandaloneBridge
    from sandforge.runtime.agent.runs import RunClock
    from sandforge.runtime.guardrails.engine import source_text

    policy = load_policy()
    limits = sandbox.config.limits
    bound = limits.max_message_bytes
    committed = None
    # --commit: read, run and write under the context file's lock, so concurrent commits serialise
    with _locked(commit_to) if commit_to is not None else contextlib.nullcontext():
        context = _read_context(context_path, bound)
        try:
            request = ExecutionRequest(**{**parts, "code": source_text(parts["code"])}, context=context,
                                       limits=limits)  # fmt: skip
        except ValidationError as exc:
            raise _invalid(exc) from None
        bridge = StandaloneBridge.of(policy)  # its fetches are brokered under the policy's egress section
        clock = RunClock()
        with sandbox:
            outcome, verdict = execute_program(sandbox, request, policy=policy, bridge=bridge,  # + its environment
                                               environments=_building_shown())  # fmt: skip
        outcome = bridge.fetches.attach(outcome)
        record_run(outcome, verdict, request, clock)  # before the commit: a run that ran is in the log
        if commit_to is not None and outcome.ok:
            data = encode_compact(outcome.context, limit=bound, what="the new context") + b"\n"
            write_user_file(commit_to, data)
            committed = commit_to
    return outcome, committed


def execute_program(
    sandbox: Sandbox, request: ExecutionRequest, **how: Any
) -> tuple[ExecutionOutcome, ValidationResult | None]:
    """``runtime.agent.program_exec.execute_program``, imported with its first run (after the sandbox began
    starting); what ``exec`` runs a program through."""
    from sandforge.runtime.agent.program_exec import execute_program as run

    return run(sandbox, request, **how)


def _locked(path: Path) -> contextlib.AbstractContextManager[object]:
    from sandforge.runtime.files import exclusive  # filelock: only for --commit

    return exclusive(path)


def record_run(outcome: ExecutionOutcome, verdict: ValidationResult | None, request: ExecutionRequest,
               clock: RunClock) -> None:  # fmt: skip
    """The run into the call log (``$SANDFORGE_CALL_LOG``, else the local state directory's
    ``<state dir>/logs/calls.jsonl``, which ``sandforge logs`` reads and ``sandforge dashboard`` shows). A log that
    cannot be written (a read-only or missing state directory) costs the run nothing: one line says so."""
    from sandforge.runtime.agent.calllog import CallLog, default_log_path
    from sandforge.runtime.agent.runs import run_record

    log.debug("ran: %s in %.1f ms", outcome.status, clock.seconds() * 1000)
    path = default_log_path()
    problem = CallLog(path, keep=1).write(run_record(outcome, verdict, request, source="cli", clock=clock))
    if problem is not None:
        why = problem.strerror or type(problem).__name__
        click.echo(f"sandforge exec: this run is not in the call log: cannot write {path}: {why}", err=True)


def _invalid(exc: ValidationError) -> UsageError:
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else ""
    where = FLAGS.get(field) or ".".join(str(p) for p in err["loc"])
    return UsageError(f"invalid {where}: {one_line(str(err['msg']))}")
