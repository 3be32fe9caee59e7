"""`sandforge policy ...`: check programs against guardrail policies; lint, test, explain, list and diff policies.

Exit codes of ``policy check``: 0 approved, 3 recoverable violations, 4 terminal violations; 2 is a usage
or policy-file error, as everywhere. ``policy test`` exits 1 when an example fails. ``policy diff`` exits 1
when anything became (or may have become) more permissive. A policy that does not load exits 2: ``policy lint``
prints every problem (one ``error:`` line each), ``--json``/``--format json|sarif`` list them all on stdout, and
text output is otherwise the CLI's one ``error:`` line (the first problems, and how many more).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import read_arg_file
from sandforge.runtime.guardrails import ENGINE_VERSION, Policy, policy_json_schema
from sandforge.runtime.guardrails import problems as policy_problems
from sandforge.runtime.guardrails.checking import check_program
from sandforge.runtime.guardrails.diff import diff_policies, loosens
from sandforge.runtime.guardrails.problems import PolicyError
from sandforge.runtime.guardrails.report import explain, render_sarif, render_text, suggestions
from sandforge.runtime.guardrails.sections import SECTIONS
from sandforge.runtime.guardrails.selftest import Example, ExampleOutcome, check_example, examples

EXIT_CODES = {"approved": 0, "recoverable": 3, "terminal": 4}
#: The largest ``limits.max_source_bytes`` a policy may set, plus one: bigger inputs are not read at all.
MAX_PROGRAM_READ_BYTES = 16 * 1024 * 1024 + 1
_policy_options = policy_options()
_json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
_format_option = click.option(
    "--format",
    "output",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="--json is the same as --format json.",
)


def _load(policies: Sequence[Path], no_default: bool, output: str = "text", *, every_line: bool = False) -> Policy:
    """The effective policy. For one that does not load, JSON and SARIF list every problem on stdout; text is the
    CLI's one ``error:`` line (the first problems; ``policy lint`` prints them all, ``every_line``). Exit 2."""
    try:
        return load_policy_option(tuple(policies), no_default)
    except PolicyError as exc:
        if output == "text" and not every_line:
            raise
        _report_problems(exc, output)


def _report_problems(exc: PolicyError, output: str) -> NoReturn:
    if output == "json":
        emit_json(policy_problems.render_json(exc.problems))
    elif output == "sarif":
        emit_json(policy_problems.render_sarif(exc.problems, ENGINE_VERSION))
    else:
        click.echo(policy_problems.render_text(exc.problems), err=True)
    sys.exit(exc.exit_code)


@click.group("policy")
def command() -> None:
    """Guardrail policies: check programs, lint, test, explain, list and diff policies."""


# -------------------------------------------------------------------------------------------- check


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@_policy_options
@_format_option
@_json_option
def check(file: str, policies: tuple[Path, ...], no_default: bool, output: str, as_json: bool) -> None:
    """Check the tool program FILE ("-" for stdin) against the policy before anything runs: its rules and
    capabilities, literal URLs against the egress rules, declared packages against the dependency rules.

    Exit status: 0 approved, 3 recoverable, 4 terminal (2: bad usage or policy file).
    """
    output = "json" if as_json else output
    policy = _load(policies, no_default, output)
    name = "<stdin>" if file == "-" else file
    # bounded (past the largest program any policy accepts, so "too large" stays a verdict up to there),
    # regular files only: /dev/zero or a FIFO is refused instead of read forever
    source = read_arg_file(file, limit=MAX_PROGRAM_READ_BYTES, what="program")
    checked = check_program(source, policy)
    result = checked.result
    if output == "json":
        extra = {"declared": list(checked.declared), "pending_imports": list(checked.pending)}
        emit_json({"file": name, **result.model_dump(mode="json"), **extra})
    elif output == "sarif":
        emit_json(render_sarif(result, name, policy))
    else:
        text = render_text(result, name)
        if checked.declared:
            text += f"\n{name}: declares {', '.join(checked.declared)} (allowed by the dependency rules)"
        if checked.pending:
            text += f"\n{name}: imports {', '.join(checked.pending)}: checked against the environment once built"
        click.echo(text)
    sys.exit(EXIT_CODES[result.verdict])


# --------------------------------------------------------------------------------------------- lint


@command.command("lint")
@click.argument("layers", nargs=-1, type=click.Path(path_type=Path))
@_policy_options
@_format_option
@_json_option
def lint(layers: tuple[Path, ...], policies: tuple[Path, ...], no_default: bool, output: str, as_json: bool) -> None:
    """Report every problem of the policy LAYERS (and --policy layers) at once: file, line, key path, message
    and hint, sorted by file and line. Exit status 2 when there is any, 0 otherwise."""
    output = "json" if as_json else output
    policy = _load((*layers, *policies), no_default, output, every_line=True)
    if output == "json":
        emit_json({**policy_problems.render_json([]), "policy": policy.name, "fingerprint": policy.fingerprint})
    elif output == "sarif":
        emit_json(policy_problems.render_sarif([], ENGINE_VERSION))
    else:
        counts = f"{len(policy.rules)} rules, {len(policy.capabilities)} capabilities"
        click.echo(f"policy {policy.name} {policy.fingerprint[:19]}: {counts}, no problems")


# --------------------------------------------------------------------------------------------- test


@command.command("test")
@click.argument("layers", nargs=-1, type=click.Path(path_type=Path))
@_policy_options
@click.option("--layer", "only", default=None, help="Test only the examples this layer wrote (its name or path).")
@click.option("-v", "--verbose", is_flag=True, help="One line per example instead of one character.")
@_json_option
def test(
    layers: tuple[Path, ...],
    policies: tuple[Path, ...],
    no_default: bool,
    only: str | None,
    verbose: bool,
    as_json: bool,
) -> None:
    """Run every rule's, capability's and section's examples against the effective policy of LAYERS (and
    --policy layers) over the default one.

    An example written for a capability a later layer grants (or denies) is skipped with a note. The summary
    says per layer what passed. Exit status 1 if any example fails.
    """
    policy = _load((*layers, *policies), no_default, "json" if as_json else "text")
    wanted = _layer_index(policy, only) if only is not None else None
    started = time.perf_counter()
    outcomes: list[ExampleOutcome] = []
    for example in examples(policy):
        if wanted is not None and not _written_by(example, policy, wanted):
            continue
        outcome = check_example(example, policy)
        outcomes.append(outcome)
        if verbose and not as_json:
            note = f"  ({outcome.detail})" if outcome.status == "skipped" else ""
            click.echo(f"{_VERBOSE[outcome.status]} {example.name}{note}")
        elif not as_json:
            click.echo({"passed": ".", "failed": "F", "skipped": "s"}[outcome.status], nl=False)
    elapsed = time.perf_counter() - started
    if as_json:
        emit_json(_test_json(policy, outcomes))
    else:
        _test_text(policy, outcomes, elapsed, verbose)
    sys.exit(1 if any(o.status == "failed" for o in outcomes) else 0)


_VERBOSE = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}


def _layer_index(policy: Policy, name: str) -> int:
    for index, (label, path) in enumerate(zip(policy.layer_labels, policy.layers, strict=True)):
        if name in (label, path, Path(path).name) or Path(name).resolve() == Path(path).resolve():
            return index
    names = ", ".join(policy.layer_labels)
    raise UsageError(f"--layer {name!r}: no such layer", hint=f"the layers are: {names}")


def _written_by(example: Example, policy: Policy, layer: int) -> bool:
    """The layer's own examples, and those of the rules it changed (its override is what they now test)."""
    if example.layer == layer:
        return True
    rule = policy.rule(example.id) if example.subject == "rule" else None
    return rule is not None and layer in rule.changed_layers


def _counts(outcomes: Sequence[ExampleOutcome]) -> dict[str, int]:
    return {status: sum(o.status == status for o in outcomes) for status in ("passed", "skipped", "failed")}


def _summary(counts: dict[str, int]) -> str:
    skipped = f"{counts['skipped']} skipped, " if counts["skipped"] else ""
    return f"{counts['passed']} passed, {skipped}{counts['failed']} failed"


def _test_text(policy: Policy, outcomes: Sequence[ExampleOutcome], elapsed: float, verbose: bool) -> None:
    if not verbose:
        click.echo()
    for outcome in outcomes:
        if outcome.status != "failed":
            continue
        example = outcome.example
        click.echo(f"\n___ {example.name} ___ ({example.origin})")
        click.echo("\n".join(f"    {line}" for line in example.source.rstrip("\n").split("\n")))
        click.echo(f"  {outcome.detail}")
    skipped = [o for o in outcomes if o.status == "skipped"]
    if skipped and not verbose:
        click.echo(f"\n{len(skipped)} skipped (a later layer changed what they assume; -v lists them):")
        for note in sorted({o.detail for o in skipped}):
            click.echo(f"  {note}")
    click.echo("\nper layer:")
    for index, label in enumerate(policy.layer_labels):
        mine = [o for o in outcomes if o.example.layer == index]
        if mine:
            click.echo(f"  {label} ({policy.layers[index]}): {_summary(_counts(mine))}")
    click.echo(f"\npolicy {policy.name} {policy.fingerprint[:19]}: {_summary(_counts(outcomes))} in {elapsed:.2f}s")


def _test_json(policy: Policy, outcomes: Sequence[ExampleOutcome]) -> dict[str, Any]:
    layers = [
        {"index": i, "name": label, "path": policy.layers[i], **_counts([o for o in outcomes if o.example.layer == i])}
        for i, label in enumerate(policy.layer_labels)
    ]
    listed = [
        {
            "name": o.example.name,
            "subject": o.example.subject,
            "id": o.example.id,
            "expectation": o.example.expectation,
            "index": o.example.index,
            "layer": policy.layer_labels[o.example.layer] if o.example.layer < len(policy.layer_labels) else None,
            "origin": o.example.origin,
            "status": o.status,
            "detail": o.detail,
        }
        for o in outcomes
    ]
    counts = _counts(outcomes)
    return {"policy": policy.name, "fingerprint": policy.fingerprint, **counts, "layers": layers, "examples": listed}


# ---------------------------------------------------------------------------------- explain, list


@command.command("explain")
@click.argument("name")
@_policy_options
@_json_option
def explain_command(name: str, policies: tuple[Path, ...], no_default: bool, as_json: bool) -> None:
    """Explain the rule, capability, section (egress, dependencies) or violation type NAME: what it catches,
    why, and what to do instead."""
    policy = _load(policies, no_default, "json" if as_json else "text")
    page = SECTIONS[name].explain(policy) if name in SECTIONS else explain(policy, name)
    if page is None:
        close = suggestions(policy, name)
        hint = f"did you mean {', '.join(close)}?" if close else "`sandforge policy list` shows every rule"
        raise UsageError(f"no rule, capability or section named {name!r}", hint=hint)
    if as_json:
        emit_json({"name": name, **_explain_json(policy, name), "page": page})
    else:
        click.echo(page)


def _explain_json(policy: Policy, name: str) -> dict[str, Any]:
    rule = policy.rule(name)
    if rule is not None:
        spec = rule.spec.model_dump(mode="json", by_alias=True)
        return {"kind": "rule", **spec, "origin": str(rule.origin), "changed_at": [str(o) for o in rule.changed_at]}
    if name in policy.capabilities:
        definition = policy.capabilities[name]
        return {"kind": "capability", "granted": name in policy.granted, "description": definition.description,
                "origin": str(definition.origin)}  # fmt: skip
    if name in SECTIONS:
        return {"kind": "section", "settings": _list_json(policy)[name]}
    return {"kind": "engine"}


@command.command("list")
@_policy_options
@_json_option
def list_command(policies: tuple[Path, ...], no_default: bool, as_json: bool) -> None:
    """List the effective policy: rules, capabilities, and the egress and dependencies sections."""
    policy = _load(policies, no_default, "json" if as_json else "text")
    if as_json:
        emit_json(_list_json(policy))
        return
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
    for name, section in SECTIONS.items():
        click.echo(f"\n{name}:")
        click.echo("\n".join(section.lines(policy)))


def _list_json(policy: Policy) -> dict[str, Any]:
    return {
        "policy": policy.name,
        "fingerprint": policy.fingerprint,
        "layers": [{"name": name, "path": path} for name, path in zip(policy.layer_labels, policy.layers, strict=True)],
        "rules": [
            {
                "id": r.id,
                "classification": r.classification,
                "enabled": r.enabled,
                "description": r.spec.description,
                "origin": str(r.origin),
            }
            for r in policy.rules
        ],
        "capabilities": [
            {"tag": tag, "granted": tag in policy.granted, "description": d.description}
            for tag, d in sorted(policy.capabilities.items())
        ],
        "egress": policy.egress.model_dump(mode="json", exclude={"credentials"})
        | {"credentials": [{"host": c.host, "header": c.header} for c in policy.egress.credentials]},
        "dependencies": policy.dependencies.model_dump(mode="json") | {"allowed": list(policy.dependencies.allowed)},
        "limits": policy.limits.model_dump(mode="json"),
    }


# --------------------------------------------------------------------------------------------- diff


@command.command("diff")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--no-default", is_flag=True, help="Compare OLD and NEW alone, without the default policy underneath.")
@_json_option
def diff_command(old: Path, new: Path, no_default: bool, as_json: bool) -> None:
    """What changes from the effective policy of OLD to that of NEW (each a directory or file layered over the
    default policy): rules added, removed, disabled, reclassified or re-matched; grants; capability detection;
    limits; egress and dependency rules.

    Exit status: 0 nothing became more permissive, 1 something did (or may have: a change that cannot be
    ordered counts), 2 bad usage or a policy file that does not load.
    """
    output = "json" if as_json else "text"
    before, after = _load((old,), no_default, output), _load((new,), no_default, output)
    changes = diff_policies(before, after)
    if as_json:
        emit_json(
            {
                "old": {"path": str(old), "policy": before.name, "fingerprint": before.fingerprint},
                "new": {"path": str(new), "policy": after.name, "fingerprint": after.fingerprint},
                "more_permissive": loosens(changes),
                "changes": [change.to_json() for change in changes],
            }
        )
    else:
        _diff_text(old, new, before, after, changes)
    sys.exit(1 if loosens(changes) else 0)


_EFFECTS = ("permissive", "unknown", "restrictive", "neutral")


def _diff_text(old: Path, new: Path, before: Policy, after: Policy, changes: Sequence[Any]) -> None:
    click.echo(f"policy diff {old} ({before.fingerprint[:19]}) -> {new} ({after.fingerprint[:19]})")
    for change in changes:
        effect = change.effect.upper() if change.effect in ("permissive", "unknown") else change.effect
        click.echo(f"{effect:<11}  {change.area:<12}  {change.subject}: {change.what}")
    counts = {effect: sum(c.effect == effect for c in changes) for effect in _EFFECTS}
    tally = ", ".join(f"{n} {effect}" for effect, n in counts.items() if n) or "no changes"
    verdict = "MORE PERMISSIVE" if loosens(list(changes)) else "not more permissive"
    click.echo(f"\n{len(changes)} change(s): {tally}; {verdict}")


# ------------------------------------------------------------------------------------------- schema


@command.command("schema")
def schema_command() -> None:
    """Print the JSON Schema of policy files (committed as policies/policy.schema.json)."""
    click.echo(json.dumps(policy_json_schema(), indent=2, ensure_ascii=False))  # a document for people to read
