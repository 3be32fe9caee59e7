"""Sandbox configuration: which backend, which limits, how many warm workers, what must be enforced."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandforge.sandbox import protections
from sandforge.sandbox.protections import DEFAULT_REQUIRED, Protection
from sandforge.sandbox.protocol import Limits

BackendName = Literal["subprocess", "docker", "gvisor", "runc", "runsc"]
#: ``docker``/``gvisor``: containers through dockerd (runc/runsc); ``runc``/``runsc``: the same runtimes
#: driven directly from an OCI bundle, without a daemon (root only).
BACKENDS: tuple[BackendName, ...] = ("subprocess", "docker", "gvisor", "runc", "runsc")


class SandboxConfigError(ValueError):
    """A SANDFORGE_* setting is malformed; the message names the variable."""


class SandboxConfig(BaseModel):
    """Everything a deployment can tune. ``from_env`` reads SANDFORGE_* overrides."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendName = "subprocess"
    limits: Limits = Field(default_factory=Limits)
    pool_size: int = Field(default=2, ge=0, le=256, description="warm workers kept ready per backend; 0 = cold")
    pool_spawn_concurrency: int = Field(default=4, ge=1, le=64, description="warm workers started at once")
    pool_idle_s: float = Field(default=300.0, gt=0, description="a warm worker idle this long is replaced")
    env_pool_idle_s: float = Field(
        default=120.0, gt=0, description="the warm pool of an environment nothing ran in for this long is closed"
    )
    env_pools_max: int = Field(default=8, ge=1, le=256, description="warm pools of environments kept at most (LRU)")
    spawn_timeout_s: float = Field(default=20.0, gt=0, description="how long a worker may take to report ready")
    prestart_threads: bool = Field(
        default=False,
        description="start each warm pool's spawn threads (its bound) when the pool is made, not on demand: a "
        "long-running service's thread count then stays flat (sandforge serve)",
    )
    required_protections: tuple[Protection, ...] = Field(
        default=DEFAULT_REQUIRED,
        description="every backend refuses to run unless each of these is verified active (default: the "
        "documented wall, see sandbox/protections.py)",
    )
    allow_missing: tuple[Protection, ...] = Field(
        default=(),
        description="protections explicitly waived: a sandbox may lack them; shown by doctor and in every "
        "outcome's metadata['protections_waived']",
    )
    zygote: bool = Field(default=True, description="fork subprocess workers from a pre-imported template process")
    env_zygotes_max: int = Field(
        default=2, ge=0, le=32,
        description="subprocess zygotes that pre-imported an environment's modules, kept at most (LRU; 0 = none); "
        "each is confined before it imports, and there are none where it cannot be (rootless: `sandforge doctor`)",
    )  # fmt: skip
    python: str | None = Field(default=None, description="interpreter for the subprocess runner (default: this one)")
    image: str = Field(default="sandforge-sandbox", description="repository name of the sandbox image")
    docker_base_url: str | None = Field(default=None, description="Docker engine URL (default: from the environment)")
    cluster: str | None = Field(
        default=None,
        pattern=r"^(auto|(ray://)?[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5})$",
        description="run executions on a Ray cluster: 'ray://HOST:PORT' (Ray Client), 'HOST:PORT' (the GCS) or "
        "'auto' (the cluster this machine belongs to); None: on this host (sandbox/cluster/, docs/deploy.md)",
    )
    cluster_channel: Literal["direct", "ray"] = Field(
        default="direct",
        description="how the caller reaches a node's sandbox host: 'direct' (the host's own authenticated "
        "connection on its node's address, ~0.1 ms; Ray's actor calls where it cannot be reached) or 'ray' "
        "(Ray's actor calls only, 1.4-2.9 ms each here); see sandbox/cluster/channel.py",
    )
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534

    @property
    def enforced_protections(self) -> tuple[Protection, ...]:
        """What every sandbox must show before it is used: required minus explicitly waived."""
        return protections.enforced(self.required_protections, self.allow_missing)

    @property
    def waived_protections(self) -> tuple[Protection, ...]:
        """What this configuration gives up compared with the documented wall (empty by default)."""
        return protections.waived(self.required_protections, self.allow_missing)

    @classmethod
    def from_env(cls, **overrides: object) -> SandboxConfig:
        """Read SANDFORGE_* overrides; a malformed value is a SandboxConfigError naming the variable."""
        env = os.environ
        values: dict[str, object] = {}
        try:
            if "SANDFORGE_BACKEND" in env:
                values["backend"] = env["SANDFORGE_BACKEND"]
            if env.get("SANDFORGE_CLUSTER"):
                values["cluster"] = env["SANDFORGE_CLUSTER"]
            if "SANDFORGE_POOL_SIZE" in env:
                values["pool_size"] = _env_int("SANDFORGE_POOL_SIZE")
            if "SANDFORGE_ENV_ZYGOTES_MAX" in env:
                values["env_zygotes_max"] = _env_int("SANDFORGE_ENV_ZYGOTES_MAX")
            if protections.REQUIRE_ENV in env:
                values["required_protections"] = protections.parse_list(
                    env[protections.REQUIRE_ENV], protections.REQUIRE_ENV
                )
            if protections.ALLOW_MISSING_ENV in env:
                values["allow_missing"] = protections.parse_list(
                    env[protections.ALLOW_MISSING_ENV], protections.ALLOW_MISSING_ENV
                )
        except ValueError as exc:
            raise SandboxConfigError(str(exc).splitlines()[0]) from exc
        if "DOCKER_HOST" in env:
            values["docker_base_url"] = env["DOCKER_HOST"]
        from_env = {k: f"SANDFORGE_{k.upper()}" for k in values if k not in overrides and k != "docker_base_url"}
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            variable = from_env.get(str(err["loc"][0])) if err["loc"] else None  # name what the user set
            raise SandboxConfigError(f"invalid {variable or 'sandbox setting ' + where}: {err['msg']}") from exc


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {os.environ[name]!r}") from None
