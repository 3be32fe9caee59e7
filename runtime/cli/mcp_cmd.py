"""`sandforge mcp`: serve one tenant's sandforge tools to an MCP client over stdio.

The tenant is a state directory (tool store, call log), a policy (layers over the default) and a model
provider, from flags or the environment (SANDFORGE_STATE_DIR, SANDFORGE_MCP_POLICY, SANDFORGE_BACKEND,
SANDFORGE_MCP_PROVIDER, SANDFORGE_MCP_PROGRAMS). stdout carries only the protocol; logs go to stderr.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.errors import UsageError
from sandforge.runtime.providers.base import Provider
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.sandbox import BACKENDS, Limits, SandboxConfig


def _provider(kind: str | None, programs: Path | None) -> Provider | None:
    """``none`` runs only healthy stored tools; ``scripted`` replays --programs; ``anthropic`` needs a key."""
    if kind is None:
        kind = "scripted" if programs else ("anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "none")
    if kind == "none":
        return None
    if kind == "scripted":
        if programs is None:
            raise UsageError("--provider scripted needs --programs FILE")
        from sandforge.runtime.providers import ScriptedProvider

        return ScriptedProvider(programs)
    if not os.environ.get("ANTHROPIC_API_KEY"):
        raise UsageError("--provider anthropic needs ANTHROPIC_API_KEY")
    from sandforge.runtime.providers import AnthropicProvider

    return AnthropicProvider()


def _limits(backend: str | None, timeout: float | None, memory: int | None) -> Limits:
    base = SandboxConfig.from_env(**({"backend": backend} if backend else {})).limits
    overrides = {k: v for k, v in (("timeout_s", timeout), ("memory_mb", memory)) if v is not None}
    try:
        return Limits(**{**base.model_dump(), **overrides})
    except ValueError as exc:
        raise UsageError(f"invalid limits: {str(exc).splitlines()[0]}") from None


@click.command("mcp")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The tenant's state directory (default: $SANDFORGE_STATE_DIR, else the user state dir).")
@policy_options(envvar="SANDFORGE_MCP_POLICY")
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="Default: SANDFORGE_BACKEND or subprocess.")
@click.option("--provider", "provider_kind", type=click.Choice(["none", "anthropic", "scripted"]), default=None,
              envvar="SANDFORGE_MCP_PROVIDER",
              help="Model provider for tools not stored yet (default: anthropic with ANTHROPIC_API_KEY, else none).")
@click.option("--programs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="SANDFORGE_MCP_PROGRAMS", help="Programs the scripted provider replays (JSON or '# ---').")
@click.option("--timeout", type=float, default=None, help="Largest wall-clock limit of one execution, seconds.")
@click.option("--memory", type=int, default=None, help="Largest memory limit of one execution, MB.")
@click.option("--name", default="sandforge", show_default=True, help="The server name clients see.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="SANDFORGE_SERVER_CONFIG", help="Serve a tenant of this server.yaml (with --tenant).")
@click.option("--tenant", default=None, envvar="SANDFORGE_TENANT",
              help="The tenant of --config to serve: its state directory, policy, provider and quotas.")
def command(**options: Any) -> None:
    """Serve sandforge's tools to an MCP client over stdio (one tenant).

    The tenant is either --config server.yaml with --tenant NAME (everything that tenant has in the server's
    configuration), or the state directory, policy and provider given here."""
    name: str = options["name"]
    if options["config_path"] is not None or options["tenant"] is not None:
        _serve_configured(options["config_path"], options["tenant"], name)
        return
    from sandforge.runtime.service.mcp import McpTenant, TenantMCP, TenantRuntime

    backend = options["backend"]
    tenant = McpTenant(
        name=name,
        state_dir=resolve_state_dir(options["state_dir"]),
        policy=load_policy_option(options["policies"], options["no_default"]),
        provider=_provider(options["provider_kind"], options["programs"]),
        backend=backend,
        limits=_limits(backend, options["timeout"], options["memory"]),
    )
    runtime = TenantRuntime(tenant)
    try:
        TenantMCP(runtime, name=name).run("stdio")
    finally:
        runtime.close()


def _serve_configured(config_path: Path | None, tenant: str | None, name: str) -> None:
    if config_path is None or tenant is None:
        raise UsageError("--config and --tenant go together")
    from sandforge.runtime.service.mcp import TenantMCP
    from sandforge.runtime.service.mcp.http import ServiceTenant
    from sandforge.runtime.service.tenants import TenantRuntimes, load_server_config

    runtimes = TenantRuntimes(load_server_config(config_path))
    try:
        runtime = runtimes.get(tenant)  # ConfigError (one line) for an unknown tenant
        TenantMCP(ServiceTenant(runtime), name=name).run("stdio")
    finally:
        runtimes.close()
