"""Fixtures: the wheelhouse `.ci/wheelhouse` prepares (tests skip without it, and fail instead under
SANDFORGE_REQUIRE_WHEELHOUSE=1, as in CI), a private copy of it, an environment store, the sandbox target."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.target import SandboxTarget, probe
from tests.environments.helpers import require_wheelhouse


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    return require_wheelhouse()


@pytest.fixture
def house(tmp_path: Path, wheelhouse: Path) -> Path:
    """A private copy of the wheelhouse a test may add distributions to."""
    copy = tmp_path / "wheelhouse"
    shutil.copytree(wheelhouse, copy)
    return copy


@pytest.fixture
def store(tmp_path: Path) -> EnvironmentStore:
    return EnvironmentStore(tmp_path / "environments")


@pytest.fixture(scope="session")
def target() -> SandboxTarget:
    return probe()
