"""Real environments for sandbox tests and benchmarks: built by ``runtime/environments`` from the wheelhouse
(``.ci/wheelhouse``) for the interpreter of the backend under test, once per session and manifest.

``envprobe`` is a distribution made on the spot and added to a copy of the wheelhouse: its module reports,
from inside the sandbox, where it is mounted and what happens when it tries to write there."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.records import PreparedEnvironment
from sandforge.runtime.environments.target import SandboxTarget, TargetCache, interpreter_key, probe, probe_container
from sandforge.sandbox import EnvironmentMount, Sandbox
from tests.environments.helpers import WHEELHOUSE_ALLOW, make_wheel, offline_policy

ENVPROBE = b"""
import errno
import os

MOUNT = os.path.dirname(os.path.abspath(__file__))


def where():
    return MOUNT


def listing():
    return sorted(os.listdir(MOUNT))


def exists(path):
    return os.path.exists(path)


def _attempt(action):
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "wrote"


def _append(path):
    with open(path, "a") as fh:
        fh.write("# planted")


def attempt_writes():
    return {
        "new_file": _attempt(lambda: _append(os.path.join(MOUNT, "planted.py"))),
        "existing": _attempt(lambda: _append(os.path.join(MOUNT, "dateutil", "__init__.py"))),
        "mkdir": _attempt(lambda: os.mkdir(os.path.join(MOUNT, "newdir"))),
        "chmod": _attempt(lambda: os.chmod(os.path.join(MOUNT, "envprobe.py"), 0o777)),
        "unlink": _attempt(lambda: os.unlink(os.path.join(MOUNT, "envprobe.py"))),
    }
"""


def target_for(sandbox: Sandbox, backend: str, cache: TargetCache, api: Any = None) -> SandboxTarget:
    """The interpreter ``backend`` runs programs on, probed once per interpreter file or image and runtime."""
    found = sandbox.interpreter(backend)  # type: ignore[arg-type]
    if found.python is not None:
        python = found.python
        return cache.get(interpreter_key(python), lambda: probe(python))
    assert found.image is not None and api is not None
    image, runtime = found.image, found.runtime
    return cache.get(f"image:{image}:{runtime}", lambda: probe_container(api, image, runtime=runtime))


class EnvFactory:
    """Environments from the wheelhouse (plus ``envprobe``), one build per (target, manifest)."""

    def __init__(self, root: Path, wheelhouse: Path, modules: dict[str, bytes] | None = None) -> None:
        """``modules``: the one-module distributions made on the spot (name -> source; default ``envprobe``)."""
        self.root = root
        house = root / "wheelhouse"
        shutil.copytree(wheelhouse, house)
        made = {"envprobe": ENVPROBE} if modules is None else modules
        for name, source in made.items():
            make_wheel(house, name, "1.0", extra={f"{name}.py": source})
        self.policy = offline_policy(house, allow=(*WHEELHOUSE_ALLOW, *made))
        self.store = EnvironmentStore(root / "environments")
        self.targets = TargetCache(root / "targets")
        self._built: dict[tuple[SandboxTarget, tuple[str, ...]], PreparedEnvironment] = {}

    def prepare(self, target: SandboxTarget, requirements: tuple[str, ...]) -> PreparedEnvironment:
        key = (target, requirements)
        if key not in self._built:
            self._built[key] = self.store.prepare(normalise(list(requirements)), self.policy, target)
        return self._built[key]

    def mount(
        self, target: SandboxTarget, requirements: tuple[str, ...], modules: tuple[str, ...] | None = None
    ) -> EnvironmentMount:
        """The request's field for that environment, exposing ``modules`` (default: all it provides)."""
        prepared = self.prepare(target, requirements)
        exposed = prepared.record.top_level if modules is None else modules
        return EnvironmentMount(env_id=prepared.env_id, site=str(prepared.site), modules=exposed)


MountFor = Callable[..., EnvironmentMount]
