"""Whether a stored artifact's environment can still be had on this machine (``sandforge tools health``).

A persisted artifact stores its `EnvironmentSpec` (pins included) and always runs with it: ready here, or
rebuilt exactly on first use. What can go wrong: today's policy refuses a distribution it pins, its source
changed (the spec names the old one), or, when asked to try (``build``), the wheels are gone (a build fails).
Such an artifact is repaired like a stale one: its next run fails to prepare and the lane regenerates it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.errors import EnvironmentFailure
from sandforge.runtime.environments.identity import EnvironmentSpec
from sandforge.runtime.environments.policy import DependencyPolicy

EnvState = Literal["ready", "missing", "built", "refused", "unbuildable"]


class EnvironmentStatus(BaseModel):
    """One artifact's environment: its id, its state here, and why when it cannot be built."""

    model_config = ConfigDict(frozen=True)

    env_id: str
    state: EnvState
    kind: str | None = None
    detail: str | None = None

    @property
    def buildable(self) -> bool:
        return self.state in ("ready", "missing", "built")


def environment_status(
    spec: EnvironmentSpec, store: EnvironmentStore, policy: DependencyPolicy, *, build: bool = False
) -> EnvironmentStatus:
    """The state of ``spec`` here under ``policy``; ``build`` builds a missing one to prove it still can be."""
    env_id = spec.env_id
    try:
        policy.check(spec.manifest.names)
        policy.check((pin.name for pin in spec.pins), transitive=True)
    except EnvironmentFailure as exc:
        return EnvironmentStatus(env_id=env_id, state="refused", kind=exc.kind, detail=str(exc))
    if spec.source != policy.sources:
        detail = f"stored for source {spec.source.describe()}, the policy now uses {policy.sources.describe()}"
        return EnvironmentStatus(env_id=env_id, state="refused", kind="dependency_policy_violation", detail=detail)
    if store.record(env_id) is not None:
        return EnvironmentStatus(env_id=env_id, state="ready")
    if not build:
        return EnvironmentStatus(env_id=env_id, state="missing")
    try:
        store.ensure(spec, max_env_mb=policy.max_env_mb)
    except EnvironmentFailure as exc:
        return EnvironmentStatus(env_id=env_id, state="unbuildable", kind=exc.kind, detail=str(exc))
    return EnvironmentStatus(env_id=env_id, state="built")
