"""Sandbox configuration: which backend, which limits, how many warm workers, what must be enforced."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox.protocol import Limits

BackendName = Literal["subprocess", "docker", "gvisor", "runc", "runsc"]
#: ``docker``/``gvisor``: containers through dockerd (runc/runsc); ``runc``/``runsc``: the same runtimes
#: driven directly from an OCI bundle, without a daemon (root only).
BACKENDS: tuple[BackendName, ...] = ("subprocess", "docker", "gvisor", "runc", "runsc")

#: Protections the subprocess backend can apply; `sandforge doctor` shows which ones are active here.
SUBPROCESS_PROTECTIONS = (
    "rlimits", "seccomp", "no_new_privs", "unprivileged_user", "private_root", "net_namespace",
    "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace",
)  # fmt: skip


class SandboxConfig(BaseModel):
    """Everything a deployment can tune. ``from_env`` reads SANDFORGE_* overrides."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendName = "subprocess"
    limits: Limits = Field(default_factory=Limits)
    pool_size: int = Field(2, ge=0, le=256, description="warm workers kept ready per backend; 0 = cold")
    pool_spawn_concurrency: int = Field(4, ge=1, le=64, description="warm workers started at once")
    pool_idle_s: float = Field(300.0, gt=0, description="a warm worker idle this long is replaced")
    spawn_timeout_s: float = Field(20.0, gt=0, description="how long a worker may take to report ready")
    required_protections: tuple[str, ...] = Field(
        ("rlimits", "seccomp", "no_new_privs"),
        description="every backend refuses to run unless each of these is verified active",
    )
    zygote: bool = Field(True, description="fork subprocess workers from a pre-imported template process")
    python: str | None = Field(None, description="interpreter for the subprocess runner (default: this one)")
    image: str = Field("sandforge-sandbox", description="repository name of the sandbox image")
    docker_base_url: str | None = Field(None, description="Docker engine URL (default: from the environment)")
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534

    @classmethod
    def from_env(cls, **overrides: object) -> SandboxConfig:
        env = os.environ
        values: dict[str, object] = {}
        if "SANDFORGE_BACKEND" in env:
            values["backend"] = env["SANDFORGE_BACKEND"]
        if "SANDFORGE_POOL_SIZE" in env:
            values["pool_size"] = int(env["SANDFORGE_POOL_SIZE"])
        if "SANDFORGE_REQUIRE_PROTECTIONS" in env:
            values["required_protections"] = tuple(
                p.strip() for p in env["SANDFORGE_REQUIRE_PROTECTIONS"].split(",") if p.strip()
            )
        if "DOCKER_HOST" in env:
            values["docker_base_url"] = env["DOCKER_HOST"]
        values.update(overrides)
        return cls.model_validate(values)
