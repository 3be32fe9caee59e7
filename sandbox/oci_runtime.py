"""The OCI runtime binaries (runc, runsc) as this project calls them: state directory, flags, environment,
and a forced delete. Shared by the runc/runsc backends and the leftovers reaper (``sandbox/leftovers.py``),
which must not import a backend."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

STATE_DIR = Path(os.environ.get("SANDFORGE_OCI_STATE_DIR", "/run/sandforge"))
#: ``runsc`` refuses to start here without it, and a sandbox has no network anyway.
RUNSC_FLAGS = ("--network=none",)
#: The runtime's environment: nothing of ours, only where to find its helpers.
RUNTIME_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def command_with(binary: str, runtime: str) -> list[str]:
    """``binary`` (the ``runc``/``runsc`` found) with this module's state directory and flags for ``runtime``."""
    return [binary, "--root", str(STATE_DIR / runtime), *(RUNSC_FLAGS if runtime == "runsc" else ())]


def runtime_command(runtime: str) -> list[str] | None:
    """``runc``/``runsc`` with this module's state directory and flags, or None when not installed."""
    binary = shutil.which(runtime)
    return None if binary is None else command_with(binary, runtime)


def force_delete(runtime: str, container_id: str) -> None:
    """Delete a container (killing it) through its runtime; nothing happens when there is no such container."""
    command = runtime_command(runtime)
    if command is None:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [*command, "delete", "--force", container_id], capture_output=True, timeout=30, env=RUNTIME_ENV, check=False
        )
