"""What a ready environment records about itself (``environment.json``, written last, the ready marker)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.environments.identity import EnvironmentSpec

#: Where an environment is mounted read-only in every sandbox (and what its bytecode names as its path).
MOUNT_PATH = "/sandforge/env"
RECORD_NAME = "environment.json"
SITE_NAME = "site"
MAX_RECORD_BYTES = 1024 * 1024


class EnvironmentRecord(BaseModel):
    """One built environment: its spec (identity), how long it took, what it costs on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_id: str
    spec: EnvironmentSpec
    created_at: float
    uv_version: str = ""
    resolve_ms: float = Field(0.0, description="0 when the resolution was cached")
    install_ms: float
    compile_ms: float
    compiled_by: str = Field("", description="the interpreter that compiled its bytecode (the host's or an image's)")
    files: int
    size_bytes: int = Field(description="installed size, every file counted once")
    unshared_bytes: int = Field(description="bytes in files not hard-linked to the uv cache (bytecode, records)")
    provides: dict[str, tuple[str, ...]] = Field(
        description="distribution -> the top-level modules it installs (what a program may import)"
    )

    @property
    def top_level(self) -> tuple[str, ...]:
        return tuple(sorted({module for modules in self.provides.values() for module in modules}))


class PreparedEnvironment(BaseModel):
    """What a caller gets: the directory to mount (``site``) and the call-log fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_id: str
    site: Path
    record: EnvironmentRecord
    cache_hit: bool
    prepare_ms: float
    resolve_ms: float = 0.0
    install_ms: float = 0.0

    def log_fields(self) -> dict[str, object]:
        """The call log's fields (issue 19): env_id, environment_cache_hit, env_prepare_ms (+ build times)."""
        fields: dict[str, object] = {
            "env_id": self.env_id,
            "environment_cache_hit": self.cache_hit,
            "env_prepare_ms": round(self.prepare_ms, 3),
        }
        if not self.cache_hit:
            fields |= {"env_resolve_ms": round(self.resolve_ms, 3), "env_install_ms": round(self.install_ms, 3)}
        return fields
