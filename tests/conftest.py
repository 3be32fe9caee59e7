"""Shared fixtures. Container tests skip without an engine, and fail under SANDFORGE_REQUIRE_DOCKER=1.

- ``docker_env`` (session): a Docker API client with the sandbox image ensured (built once when missing).
- ``sandbox_backend``: each backend name in turn (``subprocess``, ``docker``, ``gvisor``), marked and
  skipped (or failed) as the machine requires; ``sandbox``: a Sandbox on it with a small warm pool.
- Any test marked ``@pytest.mark.docker`` / ``@pytest.mark.gvisor`` gets the same requirement check.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sandbox import Sandbox, SandboxConfig

REQUIRE_DOCKER = os.environ.get("SANDFORGE_REQUIRE_DOCKER") == "1"


@dataclass
class DockerEnv:
    """What the container tests need: an API client, the image tag, and why a backend cannot run here."""

    api: Any = None
    tag: str = ""
    problems: dict[str, str] = field(default_factory=dict)

    def reason(self, backend: str) -> str | None:
        return self.problems.get(backend) or self.problems.get("engine")


def _probe_docker() -> DockerEnv:
    """Connect, make sure the expected image exists (building it once if needed), check the runtimes."""
    env = DockerEnv()
    try:
        from sandbox import image
        from sandbox.backends.base import SandboxUnavailable
        from sandbox.backends.docker_backend import connect
    except ImportError as exc:
        env.problems["engine"] = f"docker backend not importable: {exc}"
        return env
    env.tag = image.expected_tag(SandboxConfig().image)
    try:
        env.api = connect(SandboxConfig.from_env().docker_base_url)
    except SandboxUnavailable as exc:
        env.problems["engine"] = str(exc)
        return env
    try:
        if not image.status(env.api).present:
            image.build(env.api)  # idempotent and locked: parallel test workers build it once
    except Exception as exc:  # no root, no debootstrap, no mirror...: report it as the reason
        env.problems["engine"] = f"sandbox image {env.tag} missing and could not be built: {exc}"
        return env
    runtimes = env.api.info().get("Runtimes") or {}
    if "runsc" not in runtimes:
        env.problems["gvisor"] = f"no runsc runtime registered with Docker (have: {', '.join(sorted(runtimes))})"
    return env


_DOCKER_ENV: DockerEnv | None = None


def _docker_env() -> DockerEnv:
    global _DOCKER_ENV
    if _DOCKER_ENV is None:
        _DOCKER_ENV = _probe_docker()
    return _DOCKER_ENV


def container_unavailable(backend: str) -> str | None:
    """Why the given container backend cannot run here, or None when it can."""
    return None if backend == "subprocess" else _docker_env().reason(backend)


def _require_backend(backend: str) -> None:
    reason = container_unavailable(backend)
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"{backend} backend required (SANDFORGE_REQUIRE_DOCKER=1) but unavailable: {reason}")
    pytest.skip(f"{backend} backend unavailable: {reason}")


@pytest.fixture(scope="session")
def docker_env() -> Iterator[DockerEnv]:
    """The Docker engine and the sandbox image; skips (fails under SANDFORGE_REQUIRE_DOCKER=1) without them."""
    _require_backend("docker")
    env = _docker_env()
    yield env


@pytest.fixture(autouse=True)
def _container_requirements(request: pytest.FixtureRequest) -> None:
    """Tests marked docker/gvisor skip, or fail when required, where the engine or runtime is missing."""
    if request.node.get_closest_marker("gvisor") is not None:
        _require_backend("gvisor")
    elif request.node.get_closest_marker("docker") is not None:
        _require_backend("docker")


@pytest.fixture(
    params=[
        "subprocess",
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor]),
    ]
)
def sandbox_backend(request: pytest.FixtureRequest) -> str:
    """Each backend name in turn; container backends skip (or fail, when required) without an engine."""
    backend: str = request.param
    _require_backend(backend)
    return backend


@pytest.fixture
def sandbox(sandbox_backend: str) -> Iterator[Sandbox]:
    """A Sandbox on the backend under test with a small warm pool, closed after the test."""
    sb = Sandbox(SandboxConfig(backend=sandbox_backend, pool_size=1))
    try:
        yield sb
    finally:
        sb.close()
