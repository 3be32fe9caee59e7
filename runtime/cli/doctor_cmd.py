"""`sandforge doctor`: which backends work on this machine, and which protections are really in force."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from sandforge.runtime.cli.exits import Exit
from sandforge.sandbox import BACKENDS, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import rootless
from sandforge.sandbox.protections import Protection
from sandforge.sandbox.protocol import ExecutionOutcome, tripwire_canary

PROBE = "context['probe'] = sum(range(10))\nreturn 'ok'"


def probe_backend(name: str, config: SandboxConfig) -> dict[str, Any]:
    """Run one trivial program on ``name`` with no warm pool; report the outcome and the protections the
    host verified.

    ``cold_ms`` is the host's wall clock from asking for a sandbox to holding the result: it includes the
    sandbox's start-up (a container's creation and start, a zygote fork and lock-down), which
    ``execution_ms`` (the exchange with a ready sandbox) leaves out."""
    cfg = config.model_copy(update={"backend": name, "pool_size": 0})
    started = time.monotonic()
    with Sandbox(cfg) as sb:
        outcome = sb.execute(ExecutionRequest(code=PROBE))
        cold_s = time.monotonic() - started
        canary = sb.execute(tripwire_canary()) if outcome.ok else None
    protections = dict(outcome.protections)
    if Protection.AUDIT_TRIPWIRE in protections:  # self-tested by the runner: active only if the canary was stopped
        protections[Protection.AUDIT_TRIPWIRE] = protections[Protection.AUDIT_TRIPWIRE] and canary_stopped(canary)
    report: dict[str, Any] = {
        "backend": name,
        "works": outcome.ok and outcome.value == "ok" and protections.get(Protection.AUDIT_TRIPWIRE, False),
        "protections": protections,
        "required": list(cfg.enforced_protections),
        "waived": list(cfg.waived_protections),
        "cold_ms": round(cold_s * 1000, 2),
        "execution_ms": round(outcome.duration_s * 1000, 2),
    }
    if not outcome.ok:
        report["error"] = f"{outcome.error_type}: {outcome.error_message}"
    elif not protections.get(Protection.AUDIT_TRIPWIRE, False):
        got = canary.security_event if canary is not None else None
        report["error"] = f"the tripwire did not stop the canary execution (security event: {got})"
    if missing := outcome.metadata.get("protections_missing"):
        report["missing"] = list(missing)
    return report


def canary_stopped(outcome: ExecutionOutcome | None) -> bool:
    """The tripwire ended the canary execution at the event it was meant to (``sys._getframe``)."""
    event = outcome.security_event if outcome is not None else None
    return event is not None and event.source == "tripwire" and event.event == "sys._getframe"


def _mode(config: SandboxConfig) -> str:
    if not rootless(config):
        return "root"
    return f"rootless (uid {os.geteuid()}: subprocess walls from unprivileged user namespaces)"


def _env_zygotes(config: SandboxConfig) -> dict[str, Any]:
    """The bound on subprocess zygotes that pre-imported an environment (``sandbox/envzygotes.py``): none where
    they cannot be confined before they import (``_env_zygotes_off``)."""
    kept = config.env_zygotes_max if config.zygote and _env_zygotes_off(config) is None else 0
    return {"max": kept, "idle_s": config.env_pool_idle_s}


def _env_zygotes_off(config: SandboxConfig) -> str | None:
    """Why environment zygotes cannot be confined on this machine (None: they are, before any import)."""
    from sandforge.sandbox.envzygotes import confinable

    return confinable(rootless(config))


def _restrictedpython() -> dict[str, Any]:
    """The inner wall's RestrictedPython (the subprocess backend runs it; the image is built from it): its
    version, the oldest without a published escape, and why it must not be used (None when it may)."""
    from sandforge.sandbox import image

    return {"version": image.restrictedpython_version(), "minimum": image.RESTRICTEDPYTHON_MINIMUM,
            "advisory": image.restrictedpython_advisory()}  # fmt: skip


@click.command("doctor")
@click.option("--backend", "backends", multiple=True, type=click.Choice(BACKENDS), help="Only these backends.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(backends: tuple[str, ...], as_json: bool) -> None:
    """Probe backends with a real execution and show which protections are active.

    Exit status: with --backend, 0 only when every requested backend works; without, 0 when the
    configured default backend works; 6 (sandbox unavailable) otherwise, or when the installed
    RestrictedPython has published escapes; 2 for a malformed SANDFORGE_*
    setting. A backend works only with every required protection verified (see
    SANDFORGE_ALLOW_MISSING_PROTECTIONS). The cold figure includes the sandbox's start.
    """
    config = SandboxConfig.from_env()  # a malformed setting: SandboxConfigError, exit 2 (JSON under --json)
    reports = [probe_backend(name, config) for name in (backends or BACKENDS)]
    waived = list(config.waived_protections)
    inner_wall = _restrictedpython()
    if as_json:
        summary = {"default_backend": config.backend, "mode": _mode(config), "waived": waived,
                   "restrictedpython": inner_wall, "env_zygotes": _env_zygotes(config),
                   "env_zygotes_unconfinable": _env_zygotes_off(config), "backends": reports}  # fmt: skip
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"mode: {_mode(config)}")
        click.echo(inner_wall["advisory"] or f"RestrictedPython {inner_wall['version']} (no published escapes)")
        zygotes = _env_zygotes(config)
        unconfinable = _env_zygotes_off(config)
        if zygotes["max"]:
            click.echo(f"environment zygotes (subprocess, packages pre-imported): at most {zygotes['max']}, least "
                       f"recently used closed first, and any unused for {zygotes['idle_s']:g} s; each confined "
                       "before it imports (docs/environments.md)")  # fmt: skip
        elif unconfinable and config.env_zygotes_max:
            click.echo(f"environment zygotes (subprocess, packages pre-imported): off: they cannot be confined here "
                       f"({unconfinable})")  # fmt: skip
        else:
            click.echo("environment zygotes (subprocess, packages pre-imported): off (SANDFORGE_ENV_ZYGOTES_MAX)")
        if waived:
            click.echo(f"WARNING: protections waived by configuration (not required): {', '.join(waived)}")
        for r in reports:
            mark = "ok  " if r["works"] else "FAIL"
            detail = r.get("error") or f"{r['cold_ms']} ms cold (start-up included), {r['execution_ms']} ms execution"
            click.echo(f"{mark} {r['backend']:<11} {detail}")
            required, missing = set(r["required"]), set(r.get("missing", []))
            for name, active in sorted(r["protections"].items()):
                flag = "active " if active else "MISSING"
                note = "  (required)" if name in required else "  (waived)" if name in r["waived"] else ""
                click.echo(f"       {flag} {name}{note}")
            for name in sorted(missing - set(r["protections"])):
                click.echo(f"       MISSING {name}  (required)")
    if backends:
        failed = [r for r in reports if not r["works"]]
    else:
        failed = [r for r in reports if r["backend"] == config.backend and not r["works"]]
    sys.exit(Exit.UNAVAILABLE if failed or inner_wall["advisory"] else Exit.OK)
