"""The first start of a deployed service (``sandforge serve --init-from TEMPLATE``; issue 42).

A container's configuration arrives read-only (baked into the image, or mounted), but tokens are stored in the
configuration as hashes and are made when the service first starts, never at build time: no secret is in an
image layer. So the first start copies the template into the state volume (paths resolved to absolute ones),
makes one token for each tenant that has none, and writes each token once, to
``<config dir>/initial-tokens/<tenant>.token`` (0600, below a 0700 directory), for the operator to read with
``docker compose exec``. Nothing is printed: container logs are collected and kept elsewhere. A later start
finds the configuration and changes nothing; ``sandforge tokens`` manages tokens from then on.
"""

from __future__ import annotations

from pathlib import Path

from sandforge.runtime.files import exclusive
from sandforge.runtime.files.write import write_state_file
from sandforge.runtime.service.tenants import hash_token, load_server_config, new_token, save_server_config

TOKENS_DIR = "initial-tokens"


def init_from_template(template: Path, config_path: Path) -> list[str]:
    """Make ``config_path`` from ``template`` unless it exists; returns the tenants given a first token."""
    with exclusive(config_path):
        if config_path.exists():
            return []
        config = load_server_config(template)  # validated, relative paths resolved against the template
        tokens = {t.name: new_token() for t in config.tenants if not t.token_hashes}
        base = config_path.parent
        for tenant, token in tokens.items():  # tokens first: a crash here leaves no config, so it is redone
            write_state_file(base, base / TOKENS_DIR / f"{tenant}.token", token.encode() + b"\n")
        tenants = tuple(
            t.model_copy(update={"token_hashes": (hash_token(tokens[t.name]),)}) if t.name in tokens else t
            for t in config.tenants
        )
        save_server_config(config_path, config.model_copy(update={"tenants": tenants}))  # one atomic write
    return sorted(tokens)
