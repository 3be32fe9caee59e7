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

import os
import stat
from pathlib import Path

from sandforge.runtime.errors import FileIOError
from sandforge.runtime.files import exclusive
from sandforge.runtime.files.dirs import SymlinkRefused
from sandforge.runtime.files.write import write_state_file
from sandforge.runtime.service.tenants import hash_token, load_server_config, new_token, save_server_config

TOKENS_DIR = "initial-tokens"


def init_from_template(template: Path, config_path: Path) -> list[str]:
    """Make ``config_path`` from ``template`` unless it exists; returns the tenants given a first token."""
    with exclusive(config_path):
        if config_path.exists():
            return []
        if config_path.is_symlink():  # dangling: writing through it would create a file wherever it points
            raise SymlinkRefused(f"{config_path} is a symlink to nothing; the first start writes no file through it")
        config = load_server_config(template)  # validated, relative paths resolved against the template
        tokens = {t.name: new_token() for t in config.tenants if not t.token_hashes}
        base = config_path.parent
        _private_tokens_dir(base / TOKENS_DIR)
        for tenant, token in tokens.items():  # tokens first: a crash here leaves no config, so it is redone
            write_state_file(base, base / TOKENS_DIR / f"{tenant}.token", token.encode() + b"\n")
        tenants = tuple(
            t.model_copy(update={"token_hashes": (hash_token(tokens[t.name]),)}) if t.name in tokens else t
            for t in config.tenants
        )
        save_server_config(config_path, config.model_copy(update={"tenants": tenants}))  # one atomic write
    return sorted(tokens)


def _private_tokens_dir(path: Path) -> None:
    """A tokens directory that was there before the first start (planted in the volume, or left by a failed
    one) is made 0700 like a new one: another user could otherwise list, swap or delete the token files.
    A symlink is left to ``write_state_file``, which refuses it; another user's directory is refused here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # none yet (made 0700), or a symlink or a file (write_state_file refuses those)
        return
    try:
        found = os.fstat(fd)
        if found.st_uid != os.geteuid():
            raise FileIOError(f"{path} belongs to user {found.st_uid}, not to this one; no token was written",
                              hint="remove the directory, or start the service as its owner")  # fmt: skip
        if stat.S_IMODE(found.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
