"""A real local Ray cluster for the cluster tests: ``ray start`` processes on 127.0.0.1 with token
authentication, always stopped (finaliser) whatever the tests did. Skipped without Ray (``sandforge[cluster]``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import SandboxConfig
from sandforge.sandbox.cluster.host import SandboxHost
from sandforge.sandbox.cluster.local import LocalCluster, NodeSpec


def require_ray() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # not imported here: Ray reads its settings on import
        pytest.skip("Ray is not installed (pip install 'sandforge[cluster]')")


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of a developer's own Ray settings leaks into the tests."""
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "SANDFORGE_CLUSTER"):
        monkeypatch.delenv(name, raising=False)


def start_cluster(root: Path, specs: list[NodeSpec]) -> Iterator[LocalCluster]:
    require_ray()
    cluster = LocalCluster(root)
    try:
        cluster.up(specs=specs)
        saved = {k: os.environ.get(k) for k in cluster.env()}
        os.environ.update(cluster.env())  # the caller authenticates with the cluster's token
        _ray_keeps_loopback()
        try:
            yield cluster
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        cluster.down()
        assert not cluster.processes(), "the test cluster left processes behind"


def _ray_keeps_loopback() -> None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, on first import: a test that imported Ray in this
    process before a cluster's settings were in place leaves every later connection going to the machine's
    routable address, where the loopback cluster does not listen (each hangs in ``ray.init``). Say so at once."""
    ray = sys.modules.get("ray")
    if ray is not None and ray._private.ray_constants.ENABLE_RAY_CLUSTER:
        raise AssertionError(
            "Ray was imported in this test process before a test cluster's settings were set: import it in a child "
            "process (see tests/deploy/test_lean_render.py) or after start_cluster"
        )


#: The files whose tests leave a cluster as they found it share one (``cluster`` below): one xdist group, so one
#: worker starts and stops it once for all of them (each start and stop is ~20 s of CPU on a loaded machine).
#: A file that kills, restarts or needs other nodes (test_ray_faults, test_ray_executor) starts its own.
SHARED_CLUSTER = pytest.mark.xdist_group("tests-cluster-two-nodes")


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two subprocess nodes, in `sandforge cluster`'s layout (<state dir>/cluster: `sandforge cluster status`
    finds it), for the files marked ``SHARED_CLUSTER``."""
    yield from start_cluster(tmp_path_factory.mktemp("state") / "cluster", [NodeSpec(), NodeSpec()])


@pytest.fixture(scope="module")
def host() -> Iterator[SandboxHost]:
    """A sandbox host in this process, no Ray: its dispatch and cancellation paths, driven directly."""
    h = SandboxHost(SandboxConfig(backend="subprocess", pool_size=1).model_dump(mode="json"), [])
    try:
        yield h
    finally:
        h.close()
