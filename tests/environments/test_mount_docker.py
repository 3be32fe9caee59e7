"""An environment built for the sandbox image's interpreter, bind-mounted read-only into a container the way
the container backends will mount it (the wiring into the backends is the next round's): the image's
CPython imports the declared packages, writes into the mount fail, and the uv cache is not there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.records import MOUNT_PATH
from sandforge.runtime.environments.target import SandboxTarget, TargetCache, probe_container
from tests.environments.helpers import offline_policy

pytestmark = pytest.mark.docker

CHECK = f"""
import os, sys
sys.path.insert(0, {MOUNT_PATH!r})
from dateutil import parser
import bs4
print(parser.parse("2024-02-29").date(), bs4.BeautifulSoup("<i>x</i>", "html.parser").i.text)
for path in ({MOUNT_PATH!r} + "/planted.py", {MOUNT_PATH!r} + "/dateutil/__init__.py"):
    try:
        open(path, "a").close()
        print("WROTE", path)
    except OSError as exc:
        print("refused", exc.errno)
print(sorted(os.listdir({MOUNT_PATH!r}))[:3], os.path.exists(sys.argv[1]))
"""


def _run(
    api: Any, tag: str, argv: list[str], *, runtime: str, binds: dict[str, Any] | None = None, user: str = "65534:65534"
) -> str:
    config = api.create_host_config(network_mode="none", read_only=True, runtime=runtime, binds=binds or {})
    container = api.create_container(tag, command=argv, user=user, host_config=config)
    try:
        api.start(container)
        status = api.wait(container, timeout=120)
        logs: bytes = api.logs(container, stdout=True, stderr=True)
        assert status["StatusCode"] == 0, logs.decode(errors="replace")
        return logs.decode()
    finally:
        api.remove_container(container, force=True)


@pytest.mark.parametrize("runtime", ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)])
def test_the_image_interpreter_imports_from_a_read_only_mount(
    docker_env: Any, tmp_path: Path, house: Path, runtime: str
) -> None:
    if runtime == "runsc" and docker_env.reason("gvisor"):
        pytest.skip(docker_env.reason("gvisor"))
    cache = TargetCache(tmp_path / "targets")
    target: SandboxTarget = cache.get(
        f"image:{docker_env.tag}:{runtime}", lambda: probe_container(docker_env.api, docker_env.tag, runtime=runtime)
    )
    assert target.version.startswith("3.") and target.libc == "glibc"
    assert cache.get(f"image:{docker_env.tag}:{runtime}", _never) == target  # remembered: no second container
    store = EnvironmentStore(tmp_path / "environments")
    prepared = store.prepare(normalise(["python-dateutil", "beautifulsoup4"]), offline_policy(house), target)
    assert prepared.record.spec.target == target
    binds = {str(prepared.site): {"bind": MOUNT_PATH, "mode": "ro"}}
    argv = ["python3", "-I", "-S", "-B", "-c", CHECK, str(store.root / "cache")]
    for user, refused in (("65534:65534", {"refused 13", "refused 30"}), ("0:0", {"refused 30"})):
        out = _run(docker_env.api, docker_env.tag, argv, runtime=runtime, binds=binds, user=user)
        lines = out.splitlines()
        assert lines[0] == "2024-02-29 x", out
        assert set(lines[1:3]) <= refused, out  # even root inside gets EROFS: the mount is read-only
        assert lines[3].startswith("['__pycache__', 'beautifulsoup4-"), out  # packages only, no uv lock
        assert lines[3].endswith("False"), out  # the uv cache is not inside the sandbox


def _never() -> SandboxTarget:
    raise AssertionError("the target was probed again")
