"""`sandforge doctor`: which backends work on this machine, and which protections are really in force."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from sandbox import BACKENDS, ExecutionRequest, Sandbox, SandboxConfig

PROBE = "context['probe'] = sum(range(10))\nreturn 'ok'"


def probe_backend(name: str, config: SandboxConfig) -> dict[str, Any]:
    """Run one trivial program on ``name``; report the outcome and the protections the host verified."""
    cfg = config.model_copy(update={"backend": name, "pool_size": 0})
    with Sandbox(cfg) as sb:
        outcome = sb.execute(ExecutionRequest(code=PROBE))
    report: dict[str, Any] = {
        "backend": name,
        "works": outcome.ok and outcome.value == "ok",
        "protections": outcome.protections,
        "duration_ms": round(outcome.duration_s * 1000, 2),
    }
    if not outcome.ok:
        report["error"] = f"{outcome.error_type}: {outcome.error_message}"
    if name == "subprocess":
        report["required"] = list(cfg.required_protections)
    return report


@click.command("doctor")
@click.option("--backend", "backends", multiple=True, type=click.Choice(BACKENDS), help="Only these backends.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(backends: tuple[str, ...], as_json: bool) -> None:
    """Probe every backend with a real execution and show which protections are active.

    Exit status: 0 when the configured default backend works, 1 otherwise.
    """
    config = SandboxConfig.from_env()
    reports = [probe_backend(name, config) for name in (backends or BACKENDS)]
    if as_json:
        click.echo(json.dumps({"default_backend": config.backend, "backends": reports}, indent=2))
    else:
        for r in reports:
            mark = "ok  " if r["works"] else "FAIL"
            detail = r.get("error") or f"{r['duration_ms']} ms (cold)"
            click.echo(f"{mark} {r['backend']:<11} {detail}")
            required = set(r.get("required", []))
            for name, active in sorted(r["protections"].items()):
                flag = "active " if active else "MISSING"
                click.echo(f"       {flag} {name}{'  (required)' if name in required else ''}")
    default = next((r for r in reports if r["backend"] == config.backend), None)
    sys.exit(0 if default is None or default["works"] else 1)
