"""Fixtures: the wheelhouse `.ci/wheelhouse` prepares (tests skip without it, and fail instead under
SANDFORGE_REQUIRE_WHEELHOUSE=1, as in CI), a private copy of it, an environment store, the sandbox target."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.target import SandboxTarget, probe

REPO = Path(__file__).resolve().parents[2]
REQUIRE = os.environ.get("SANDFORGE_REQUIRE_WHEELHOUSE") == "1"
NEEDED = ("python_dateutil-", "beautifulsoup4-", "soupsieve-", "six-")


def _wheelhouse() -> Path | None:
    configured = os.environ.get("SANDFORGE_TEST_WHEELHOUSE", "").strip()
    path = Path(configured) if configured else REPO / ".wheelhouse"
    if not path.is_dir():
        return None
    names = [p.name for p in path.glob("*.whl")]
    return path if all(any(n.startswith(prefix) for n in names) for prefix in NEEDED) else None


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    found = _wheelhouse()
    if found is None:
        message = "no wheelhouse: run .ci/wheelhouse (or set SANDFORGE_TEST_WHEELHOUSE)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    return found


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
