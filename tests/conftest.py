"""Shared fixtures. Container tests skip without an engine, and fail under SANDFORGE_REQUIRE_DOCKER=1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxConfig

REQUIRE_DOCKER = os.environ.get("SANDFORGE_REQUIRE_DOCKER") == "1"


def container_unavailable(backend: str) -> str | None:
    """Why the given container backend cannot run here, or None when it can."""
    try:
        from sandbox.backends.docker_backend import DockerBackend
    except ImportError as exc:
        return f"docker backend not importable: {exc}"
    backend_obj = DockerBackend(SandboxConfig(), runtime="runsc" if backend == "gvisor" else None)
    try:
        return backend_obj.unavailable_reason()
    finally:
        backend_obj.close()


def _require_backend(backend: str) -> None:
    if backend == "subprocess":
        return
    reason = container_unavailable(backend)
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"{backend} backend required (SANDFORGE_REQUIRE_DOCKER=1) but unavailable: {reason}")
    pytest.skip(f"{backend} backend unavailable: {reason}")


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
    sb = Sandbox(SandboxConfig(backend=sandbox_backend, pool_size=1))  # type: ignore[arg-type]
    try:
        yield sb
    finally:
        sb.close()
