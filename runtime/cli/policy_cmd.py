"""`sandforge policy ...`: check programs against guardrail policies; test, explain and list policies.

Exit codes of ``policy check``: 0 approved, 3 recoverable violations, 4 terminal violations; 2 is a usage
or policy-file error, as everywhere. ``policy test`` exits 1 when an example fails.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import read_arg_file
from sandforge.runtime.guardrails import Policy, policy_json_schema, validate
from sandforge.runtime.guardrails.report import explain, render_sarif, render_text, suggestions
from sandforge.runtime.guardrails.selftest import check_example, examples

EXIT_CODES = {"approved": 0, "recoverable": 3, "terminal": 4}
#: The largest ``limits.max_source_bytes`` a policy may set, plus one: bigger inputs are not read at all.
MAX_PROGRAM_READ_BYTES = 16 * 1024 * 1024 + 1
F = TypeVar("F", bound=Callable[..., Any])


def _load(policies: tuple[Path, ...], no_default: bool) -> Policy:
    return load_policy_option(policies, no_default)


_policy_options = policy_options()


@click.group("policy")
def command() -> None:
    """Guardrail policies: check programs, test and explain rules."""


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@_policy_options
@click.option("--format", "output", type=click.Choice(["text", "json", "sarif"]), default="text", show_default=True)
def check(file: str, policies: tuple[Path, ...], no_default: bool, output: str) -> None:
    """Validate the tool program FILE ("-" for stdin): violations, capabilities, verdict.

    Exit status: 0 approved, 3 recoverable, 4 terminal (2: bad usage or policy file).
    """
    policy = _load(policies, no_default)
    name = "<stdin>" if file == "-" else file
    # bounded (past the largest program any policy accepts, so "too large" stays a verdict up to there),
    # regular files only: /dev/zero or a FIFO is refused instead of read forever
    source = read_arg_file(file, limit=MAX_PROGRAM_READ_BYTES, what="program")
    result = validate(source, policy)
    if output == "json":
        emit_json({"file": name, **result.model_dump(mode="json")})
    elif output == "sarif":
        emit_json(render_sarif(result, name, policy))
    else:
        click.echo(render_text(result, name))
    sys.exit(EXIT_CODES[result.verdict])


@command.command("test")
@click.argument("layers", nargs=-1, type=click.Path(path_type=Path))
@click.option("--no-default", is_flag=True, help="Test LAYERS alone, without the default policy underneath.")
@click.option("-v", "--verbose", is_flag=True, help="One line per example instead of one character.")
def test(layers: tuple[Path, ...], no_default: bool, verbose: bool) -> None:
    """Run every rule's and capability's examples against the policy LAYERS (default: the default policy).

    LAYERS are layered over the default policy unless --no-default is given. Exit status 1 if any example
    fails.
    """
    policy = _load(layers, no_default)
    started = time.perf_counter()
    failures = []
    count = 0
    for example in examples(policy):
        outcome = check_example(example, policy)
        count += 1
        if verbose:
            click.echo(f"{'PASS' if outcome.passed else 'FAIL'} {example.name}")
        else:
            click.echo("." if outcome.passed else "F", nl=False)
        if not outcome.passed:
            failures.append(outcome)
    if not verbose:
        click.echo()
    for outcome in failures:
        example = outcome.example
        click.echo(f"\n___ {example.name} ___ ({example.origin})")
        click.echo("\n".join(f"    {line}" for line in example.source.rstrip("\n").split("\n")))
        click.echo(f"  {outcome.detail}")
    elapsed = time.perf_counter() - started
    summary = f"{count - len(failures)} passed, {len(failures)} failed in {elapsed:.2f}s"
    click.echo(f"\npolicy {policy.name} {policy.fingerprint[:19]}: {summary}")
    sys.exit(1 if failures else 0)


@command.command("explain")
@click.argument("name")
@_policy_options
def explain_command(name: str, policies: tuple[Path, ...], no_default: bool) -> None:
    """Explain the rule, capability or violation type NAME: what it catches, why, and what to do instead."""
    policy = _load(policies, no_default)
    page = explain(policy, name)
    if page is None:
        close = suggestions(policy, name)
        hint = f"did you mean {', '.join(close)}?" if close else "`sandforge policy list` shows every rule"
        raise UsageError(f"no rule or capability named {name!r}", hint=hint)
    click.echo(page)


@command.command("list")
@_policy_options
def list_command(policies: tuple[Path, ...], no_default: bool) -> None:
    """List the effective policy's rules and capabilities."""
    policy = _load(policies, no_default)
    click.echo(f"policy {policy.name} {policy.fingerprint}")
    click.echo(f"layers: {', '.join(policy.layers)}\n")
    width = max(len(rule.id) for rule in policy.rules) if policy.rules else 0
    for rule in policy.rules:
        state = "" if rule.enabled else " (disabled)"
        click.echo(f"{rule.id:<{width}}  {rule.classification:<11}  {rule.spec.description}{state}")
    click.echo("\ncapabilities:")
    for tag, definition in sorted(policy.capabilities.items()):
        state = "granted" if tag in policy.granted else "denied "
        click.echo(f"  {tag:<{width}}  {state}  {definition.description}")


@command.command("schema")
def schema_command() -> None:
    """Print the JSON Schema of policy files (committed as policies/policy.schema.json)."""
    click.echo(json.dumps(policy_json_schema(), indent=2, ensure_ascii=False))  # a document for people to read
