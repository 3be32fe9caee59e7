"""One build from the package index itself (the other tests build from the wheelhouse, offline). Needs the
index; skipped when it cannot be reached, failed instead under SANDFORGE_REQUIRE_WHEELHOUSE=1 (CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.environments.target import SandboxTarget
from tests.environments.helpers import require_index

pytestmark = pytest.mark.slow


def test_build_from_the_index(tmp_path: Path, target: SandboxTarget) -> None:
    require_index()
    policy = DependencyPolicy(allow=("six",), source="index")
    store = EnvironmentStore(tmp_path / "environments")
    prepared = store.prepare(normalise(["six>=1.16"]), policy, target)
    (pin,) = prepared.record.spec.pins
    assert pin.name == "six" and pin.version.startswith("1.")
    assert prepared.record.spec.source.source == "index"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(prepared.site)!r}); import six"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
