"""An environment's bytecode is compiled by an interpreter of the sandbox's bytecode tag: this host's when the
tags match, else the sandbox's own (in a throwaway container of the backend's image); never a mismatch."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.bytecode import cache_tag, compile_on_host
from sandforge.runtime.environments.errors import DependencyInstallFailed
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.target import SandboxTarget
from sandforge.runtime.guardrails import default_policy
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from tests.environments.helpers import offline_policy

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""


def _pycs(site: Path) -> list[Path]:
    return sorted(site.rglob("*.pyc"))


def _hash_based_unchecked(pyc: Path) -> bool:
    header = pyc.read_bytes()[:16]
    return header[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(header[4:8], "little") == 0b01


def test_a_host_interpreter_of_another_tag_never_compiles(
    store: EnvironmentStore, target: SandboxTarget, wheelhouse: Path
) -> None:
    store._tags[store.python] = "cpython-399"  # this host's interpreter as if of another minor version
    with pytest.raises(DependencyInstallFailed, match=r"cannot compile bytecode for cpython-3\d+: .* cpython-399"):
        store.prepare(normalise(["python-dateutil"]), offline_policy(wheelhouse), target)
    assert store.ready() == [] and not any(p for p in store.envs.iterdir() if p.name.startswith(".tmp-"))


def test_the_target_interpreter_compiles_when_the_host_tag_differs(
    store: EnvironmentStore, target: SandboxTarget, wheelhouse: Path
) -> None:
    used: list[Path] = []

    def target_compiler(site: Path) -> None:  # stands for the sandbox's interpreter (here: one of its tag)
        used.append(site)
        compile_on_host(store.python, site)

    store._tags[store.python] = "cpython-399"
    store.compilers[target] = ("the sandbox's own", target_compiler)
    prepared = store.prepare(normalise(["python-dateutil"]), offline_policy(wheelhouse), target)
    assert len(used) == 1 and used[0].name == "site" and prepared.record.compiled_by == "the sandbox's own"
    assert _pycs(prepared.site) and all(_hash_based_unchecked(p) for p in _pycs(prepared.site))


def test_the_host_compiles_when_the_tags_match(
    store: EnvironmentStore, target: SandboxTarget, wheelhouse: Path
) -> None:
    store.compilers[target] = ("unused", lambda site: pytest.fail("the target's compiler ran"))
    prepared = store.prepare(normalise(["six"]), offline_policy(wheelhouse), target)
    assert prepared.record.compiled_by == f"host {store.python} ({target.cache_tag})"


@pytest.fixture(
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("runsc", marks=pytest.mark.oci("runsc"))]
)
def image_sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend=request.param, pool_size=0))
    try:
        yield sb
    finally:
        sb.close()


def test_the_images_own_interpreter_compiles_in_a_container_and_the_sandbox_imports_it(
    image_sandbox: Sandbox, wheelhouse: Path, tmp_path: Path
) -> None:
    """Forced (``compile_in="target"``, as on a host of another minor version): the bytecode is compiled in a
    throwaway container of the backend's image, owned by this user, and the program imports it read-only."""
    root = tmp_path / "environments"
    envs = Environments(root, store=EnvironmentStore(root, compile_in="target"))
    policy = dataclasses.replace(default_policy(), dependencies=offline_policy(wheelhouse))
    request = ExecutionRequest(code=DATEUTIL, args=["5 March 2024"], limits=Limits(timeout_s=30))
    outcome, _ = execute_program(image_sandbox, request, policy=policy, environments=envs)
    assert outcome.ok and outcome.value == "2024-03-05T00:00:00", outcome
    record = envs.store.record(str(outcome.metadata["env_id"]))
    assert record is not None and record.compiled_by.startswith("image sandforge-sandbox:"), record.compiled_by
    pycs = _pycs(envs.store.site(record.env_id))
    assert any(p.parent.parent.name == "parser" and p.name.startswith("_parser.") for p in pycs)
    assert all(p.name.endswith(f".{record.spec.target.cache_tag}.pyc") for p in pycs)
    assert all(_hash_based_unchecked(p) and p.stat().st_uid == os.getuid() for p in pycs)


def _other_minor() -> str | None:
    """An interpreter on this machine of another minor version than this one (SANDFORGE_TEST_OTHER_PYTHON, a
    ``python3.N`` on PATH, or a pyenv version), to stand for a host whose Python is not the sandbox's."""
    mine = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found = [os.environ.get("SANDFORGE_TEST_OTHER_PYTHON", "")]
    found += [shutil.which(f"python3.{minor}") or "" for minor in (12, 13, 10)]
    found += [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.1[023].*/bin/python3"))]
    for python in filter(None, found):
        tag = cache_tag(python)
        if tag and tag != sys.implementation.cache_tag and mine not in python:
            return python
    return None


@pytest.fixture(params=["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def any_sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend=request.param, pool_size=0))
    try:
        yield sb
    finally:
        sb.close()


def test_a_builder_of_another_minor_version_builds_for_the_sandboxs_interpreter(
    any_sandbox: Sandbox, wheelhouse: Path, tmp_path: Path
) -> None:
    """The builder's own interpreter (``EnvironmentStore(python=)``) is of another minor version than the
    sandbox's: the environment is still built for the sandbox's (wheels, bytecode) and its program runs."""
    other = _other_minor()
    if other is None:
        pytest.skip("no interpreter of another minor version on this machine (set SANDFORGE_TEST_OTHER_PYTHON)")
    root = tmp_path / "environments"
    envs = Environments(root, store=EnvironmentStore(root, python=other))
    policy = dataclasses.replace(default_policy(), dependencies=offline_policy(wheelhouse))
    request = ExecutionRequest(code=DATEUTIL, args=["5 March 2024"], limits=Limits(timeout_s=30))
    outcome, _ = execute_program(any_sandbox, request, policy=policy, environments=envs)
    assert outcome.ok and outcome.value == "2024-03-05T00:00:00", outcome
    record = envs.store.record(str(outcome.metadata["env_id"]))
    assert record is not None and other not in record.compiled_by, record.compiled_by
    tag = record.spec.target.cache_tag
    assert tag != cache_tag(other)
    pycs = _pycs(envs.store.site(record.env_id))
    assert pycs and all(p.name.endswith(f".{tag}.pyc") for p in pycs)
