"""`sandforge mcp`: serve one tenant's sandforge tools to an MCP client over stdio.

The tenant is a state directory (tool store, call log), a policy (layers over the default) and a model
provider, from flags or the environment (SANDFORGE_STATE_DIR, SANDFORGE_MCP_POLICY, SANDFORGE_BACKEND,
SANDFORGE_MCP_PROVIDER, SANDFORGE_MCP_PROGRAMS). stdout carries only the protocol; logs go to stderr.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.cli.model_options import model_options, model_settings
from sandforge.runtime.errors import ConfigError, UsageError
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.sandbox import BACKENDS, Limits, SandboxConfig

if TYPE_CHECKING:
    from sandforge.runtime.service.tenants import ProviderConfig

#: The tenant a stdio server started from flags serves (its name only shows in logs).
STDIO_TENANT = "local"


def _provider(kind: str | None, programs: Path | None, model: dict[str, Any]) -> ProviderConfig:
    """``none`` runs only healthy stored tools; ``scripted`` replays --programs; ``anthropic`` and ``openai``
    need a key; ``replay`` serves --replay (a file --record wrote)."""
    from sandforge.runtime.providers.factory import ProviderUnavailable, key_for
    from sandforge.runtime.service.tenants import ProviderConfig

    if kind is None:
        kind = "scripted" if programs else ("anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "none")
    if kind == "scripted" and programs is None:
        raise UsageError("--provider scripted needs --programs FILE")
    if kind == "replay" and model.get("recording") is None:
        raise UsageError("--provider replay needs --replay FILE")
    if model.get("record") is not None and kind not in ("anthropic", "openai"):
        raise UsageError("--record needs a live provider (--provider anthropic or openai)")
    try:
        config = ProviderConfig(kind=kind, programs=programs if kind == "scripted" else None,
                                **{k: v for k, v in model.items() if v is not None})  # fmt: skip
        if kind in ("anthropic", "openai"):
            key_for(kind, config)
    except ProviderUnavailable as exc:
        raise UsageError(f"--provider {kind}: {exc.message}") from None
    except ValueError as exc:
        raise UsageError(f"invalid provider options: {str(exc).splitlines()[-1].strip()}") from None
    return config


def _caps(backend: str | None, timeout: float | None, memory: int | None) -> tuple[float, int]:
    """The largest limits a request may ask for: the flags, else the sandbox's defaults."""
    base = SandboxConfig.from_env(**({"backend": backend} if backend else {})).limits
    try:
        limits = Limits(**{**base.model_dump(), "timeout_s": timeout or base.timeout_s,
                           "memory_mb": memory or base.memory_mb})  # fmt: skip
    except ValueError as exc:
        raise UsageError(f"invalid limits: {str(exc).splitlines()[0]}") from None
    return limits.timeout_s, limits.memory_mb


@click.command("mcp")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The tenant's state directory (default: $SANDFORGE_STATE_DIR, else the user state dir).")
@policy_options(envvar="SANDFORGE_MCP_POLICY")
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="Default: SANDFORGE_BACKEND or subprocess.")
@click.option("--provider", "provider_kind", type=click.Choice(["none", "anthropic", "openai", "scripted", "replay"]),
              default=None, envvar="SANDFORGE_MCP_PROVIDER",
              help="Model provider for tools not stored yet (default: anthropic with ANTHROPIC_API_KEY, else none).")
@model_options()
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
    from sandforge.runtime.service.mcp import TenantMCP
    from sandforge.runtime.service.tenants import standalone_tenant

    backend = options["backend"]
    policy = load_policy_option(options["policies"], options["no_default"])  # one-line errors before serving
    max_timeout, max_memory = _caps(backend, options["timeout"], options["memory"])
    try:
        runtime = standalone_tenant(
            STDIO_TENANT, resolve_state_dir(options["state_dir"]), policy=policy,
            provider=_provider(options["provider_kind"], options["programs"], model_settings(options)), backend=backend,
            max_timeout_s=max_timeout, max_memory_mb=max_memory,
        )  # fmt: skip
    except ConfigError as exc:
        raise UsageError(str(exc).removeprefix("tenant: ")) from None
    try:
        TenantMCP(runtime, name=name).run("stdio")
    finally:
        runtime.close()


def _serve_configured(config_path: Path | None, tenant: str | None, name: str) -> None:
    if config_path is None or tenant is None:
        raise UsageError("--config and --tenant go together")
    from sandforge.runtime.service.mcp import TenantMCP
    from sandforge.runtime.service.tenants import TenantRuntimes, load_server_config

    runtimes = TenantRuntimes(load_server_config(config_path))
    try:
        runtime = runtimes.get(tenant)  # ConfigError (one line) for an unknown tenant
        TenantMCP(runtime, name=name).run("stdio")
    finally:
        runtimes.close()
