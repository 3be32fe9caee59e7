"""Concurrent requests for one environment build it once; a build killed halfway leaves nothing ready."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandforge.runtime.environments.builder import TMP_PREFIX, EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.target import SandboxTarget
from tests.environments.helpers import calls, offline_policy, uv_wrapper

# A builder in its own process: prepare one environment and print what it got.
BUILDER = """
import json, sys
from pathlib import Path
from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.environments.target import SandboxTarget
root, uv, policy, target = sys.argv[1:5]
store = EnvironmentStore(Path(root), uv=uv)
prepared = store.prepare(
    normalise(["python-dateutil>=2.8", "beautifulsoup4"]),
    DependencyPolicy.model_validate_json(policy),
    SandboxTarget.model_validate_json(target),
)
print(json.dumps(prepared.log_fields()))
"""


def _builder(root: Path, uv: str, house: Path, target: SandboxTarget) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", BUILDER, str(root), uv]
    argv += [offline_policy(house).model_dump_json(), target.model_dump_json()]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen[str], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_concurrent_builds_of_one_environment_build_it_once(tmp_path: Path, house: Path, target: SandboxTarget) -> None:
    log = tmp_path / "uv.log"
    uv = uv_wrapper(tmp_path, log=log)
    root = tmp_path / "root"
    builders = [_builder(root, uv, house, target) for _ in range(3)]
    results = []
    for proc in builders:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert len({r["env_id"] for r in results}) == 1
    assert sorted(r["environment_cache_hit"] for r in results) == [False, True, True]
    assert calls(log).count("install") == 1
    assert len(EnvironmentStore(root).ready()) == 1


def test_a_build_killed_halfway_leaves_no_ready_environment(tmp_path: Path, house: Path, target: SandboxTarget) -> None:
    root = tmp_path / "root"
    installed = tmp_path / "installed"
    stalling = uv_wrapper(tmp_path, log=tmp_path / "uv.log", stall_after_install=installed)
    proc = _builder(root, stalling, house, target)
    try:
        _wait_for(installed, proc)  # packages are in the temporary directory; bytecode and record are not
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    store = EnvironmentStore(root)
    assert store.ready() == []
    leftovers = store.leftovers()
    assert [p.name.startswith(TMP_PREFIX) for p in leftovers] == [True]
    assert (leftovers[0] / "site" / "dateutil").is_dir()  # it was halfway: installed, never renamed
    # the killed builder's lock died with it: the next request builds, and clears the leftover
    prepared = store.prepare(normalise(["python-dateutil>=2.8", "beautifulsoup4"]), offline_policy(house), target)
    assert not prepared.cache_hit
    assert store.leftovers() == []
    assert [r.env_id for r in store.ready()] == [prepared.env_id]
