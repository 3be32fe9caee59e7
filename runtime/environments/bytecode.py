"""Bytecode for an environment, compiled by an interpreter of the sandbox's own bytecode tag.

A read-only mount cannot cache ``.pyc``, so the builder compiles every module before the environment is
ready: checked by hash never by time (the mount is immutable), naming the mount path in tracebacks. The
magic number of the bytecode must be the one of the interpreter that runs it: the host's interpreter serves
when its cache tag is the sandbox's (one minor version: one magic number), else the sandbox's own
interpreter compiles it, in a throwaway container of the backend's image (`compile_in_container`: no
network, read-only root, the environment's temporary directory its only writable mount)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandforge.runtime.environments.errors import DependencyInstallFailed
from sandforge.runtime.environments.records import MOUNT_PATH

#: ``python`` + these + the directory: what compiles an environment (one process: faster than a pool here).
COMPILE_ARGS = ("-I", "-m", "compileall", "-q", "-j", "1", "-d", MOUNT_PATH, "--invalidation-mode", "unchecked-hash")
_TAG = "import sys; print(sys.implementation.cache_tag)"

#: Compiles the ``site`` directory it is given in place, or raises `DependencyInstallFailed`.
Compiler = Callable[[Path], None]


def cache_tag(python: str) -> str:
    """The bytecode tag of the interpreter at ``python`` ('' when it does not run)."""
    try:
        done = subprocess.run([python, "-I", "-c", _TAG], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def compile_on_host(python: str, site: Path) -> None:
    done = subprocess.run([python, *COMPILE_ARGS, str(site)], capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise DependencyInstallFailed(f"compiling bytecode failed: {_first_line(done.stdout + done.stderr)}")


def compile_in_container(
    api: Any, image: str, site: Path, *, runtime: str | None = None, timeout: float = 600.0
) -> None:
    """Compile ``site`` with the interpreter of ``image`` (``api``: a low-level Docker API client), bound at
    the mount path, as this process's uid (the files stay the host user's)."""
    config = api.create_host_config(
        network_mode="none", read_only=True, runtime=runtime, cap_drop=["ALL"], security_opt=["no-new-privileges"],
        binds={str(site): {"bind": MOUNT_PATH, "mode": "rw"}},
    )  # fmt: skip
    user = f"{os.getuid()}:{os.getgid()}"
    command = ["python3", *COMPILE_ARGS, MOUNT_PATH]
    try:
        container = api.create_container(image, command=command, user=user, host_config=config)
    except Exception as exc:  # the engine down, the image gone: the world's fault
        raise DependencyInstallFailed(f"cannot compile bytecode in image {image}: {_first_line(str(exc))}") from None
    try:
        api.start(container)
        status = api.wait(container, timeout=timeout)
        output = api.logs(container, stdout=True, stderr=True).decode("utf-8", "replace")
    except Exception as exc:
        raise DependencyInstallFailed(f"compiling bytecode in image {image} failed: {_first_line(str(exc))}") from None
    finally:
        api.remove_container(container, force=True)
    if status.get("StatusCode") != 0:
        raise DependencyInstallFailed(f"compiling bytecode in image {image} failed: {_first_line(output)}")


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else "no message"
