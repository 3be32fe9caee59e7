"""The sandbox's interpreter, as an environment is built for it: implementation, exact version, ABI and
platform. Wheels are chosen for *this* interpreter (its version bounds `Requires-Python`, its glibc and
machine bound manylinux tags), not for the host's, and it is part of every environment's identity.

`probe(python)` asks an interpreter on this machine (the subprocess backend's); `probe_container` asks a
container image's, by running the same probe inside it. `TargetCache` remembers both, so an execution's
preparation never starts a process for it (the next round wires them into the backends)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandforge.runtime.environments.errors import DependencyInstallFailed

_PROBE = (
    "import json, platform, sys, sysconfig;"
    "libc = platform.libc_ver();"
    "print(json.dumps({'implementation': sys.implementation.name, 'version': platform.python_version(),"
    " 'cache_tag': sys.implementation.cache_tag, 'platform': sysconfig.get_platform(),"
    " 'machine': platform.machine(), 'libc': libc[0], 'libc_version': libc[1]}))"
)
PROBE_ARGV = ("-I", "-S", "-c", _PROBE)


class SandboxTarget(BaseModel):
    """The interpreter programs run on inside the sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    implementation: str = Field(pattern=r"^cpython$", description="only CPython sandboxes exist")
    version: str = Field(pattern=r"^3\.\d+\.\d+$", description="exact version, e.g. 3.11.2")
    cache_tag: str = Field(pattern=r"^cpython-3\d+$", description="bytecode tag, e.g. cpython-311")
    platform: str = Field(pattern=r"^linux-(x86_64|aarch64)$")
    machine: str = Field(pattern=r"^(x86_64|aarch64)$")
    libc: str = Field(pattern=r"^glibc$", description="musl sandboxes are not supported")
    libc_version: str = Field(pattern=r"^\d+\.\d+$")

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def abi(self) -> str:
        return "cp" + self.minor.replace(".", "")

    @property
    def uv_platform(self) -> str:
        """uv's ``--python-platform``: manylinux up to the sandbox's glibc."""
        return f"{self.machine}-manylinux_{self.libc_version.replace('.', '_')}"

    def uv_args(self) -> list[str]:
        return ["--python-version", self.version, "--python-platform", self.uv_platform]

    def label(self) -> str:
        return f"CPython {self.version} ({self.abi}, {self.uv_platform})"


def probe(python: str | None = None, *, timeout: float = 30.0) -> SandboxTarget:
    """Describe the interpreter at ``python`` (default: this one) by running it."""
    argv = [python or sys.executable, *PROBE_ARGV]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DependencyInstallFailed(f"cannot run the sandbox interpreter {argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise DependencyInstallFailed(f"the sandbox interpreter {argv[0]} failed to describe itself")
    return parse_probe(done.stdout)


def parse_probe(output: str | bytes) -> SandboxTarget:
    """The target an interpreter described by running ``python`` + `PROBE_ARGV` (e.g. inside a container)."""
    try:
        return SandboxTarget.model_validate(json.loads(output))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise DependencyInstallFailed(f"the sandbox interpreter is not one environments can target: {first}") from None


def probe_container(api: Any, image: str, *, runtime: str | None = None, timeout: float = 120.0) -> SandboxTarget:
    """Describe the interpreter of a container image by running the probe in a throwaway container (no
    network, read-only root, uid 65534). ``api`` is a low-level Docker API client (``docker.APIClient``)."""
    config = api.create_host_config(network_mode="none", read_only=True, runtime=runtime)
    container = api.create_container(image, command=["python3", *PROBE_ARGV], user="65534:65534", host_config=config)
    try:
        api.start(container)
        status = api.wait(container, timeout=timeout)
        output = api.logs(container, stdout=True, stderr=False)
    finally:
        api.remove_container(container, force=True)
    if status.get("StatusCode") != 0:
        raise DependencyInstallFailed(f"the interpreter of image {image} failed to describe itself")
    return parse_probe(output)


class TargetCache:
    """Targets remembered per key (an image tag and runtime, an interpreter path and its size and mtime), so
    preparing an execution never starts a process to learn what it already knows."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, key: str, describe: Callable[[], SandboxTarget]) -> SandboxTarget:
        path = self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
        with contextlib.suppress(OSError, ValueError, ValidationError):
            return SandboxTarget.model_validate_json(path.read_bytes())
        target = describe()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        staged.write_text(target.model_dump_json())
        staged.replace(path)
        return target


def interpreter_key(python: str | None = None) -> str:
    """A cache key that changes when the interpreter at ``python`` is replaced (upgraded in place)."""
    path = Path(python or sys.executable).resolve()
    info = path.stat()
    return f"python:{path}:{info.st_size}:{info.st_mtime_ns}"
