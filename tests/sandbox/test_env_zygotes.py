"""Issue 39 item 3: a subprocess worker for a program that declares packages is forked from a zygote that
already imported the environment's top-level modules (``sandbox/envzygotes.py``, ``inside/preload.py``).

``stamp`` is a distribution made on the spot: it records, at import, the pid of the process importing it and
its own directory (from ``__file__``). A program reads both: the pid is the environment zygote's (not the
runner's own) only when the module was pre-imported, and the directory it recorded on the host is the mount
the runner sees. An environment's zygote forks runners for that environment only. The withheld surface of a
pre-imported numpy and pandas stays withheld (``test_package_loaders``' attacks, through an environment
zygote)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend, SubprocessWorker, rootless
from sandforge.sandbox.environment import check_mount, require_mounted
from sandforge.sandbox.envzygotes import confinable
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.inside import envmodules, preload
from sandforge.sandbox.protocol import ENV_MOUNT_PATH, Limits, ReadyFrame
from tests.environments.helpers import require_wheelhouse
from tests.sandbox.envbuild import EnvFactory, target_for
from tests.sandbox.test_package_loaders import IndexEnvironments, assert_every_attack_stopped, index_envs

__all__ = ["index_envs"]  # the session fixture, shared with test_package_loaders

#: Environment zygotes exist only where they can be confined (real root: docs/environments.md); elsewhere (the
#: CI's rootless run) the tests that need one skip, and ``test_env_zygote_walls`` checks there is none.
UNCONFINABLE = confinable(rootless(SandboxConfig()))
needs_zygotes = pytest.mark.skipif(UNCONFINABLE is not None, reason=f"no environment zygote here: {UNCONFINABLE}")

STAMP = b"""
import os
from pathlib import Path

IMPORTED_BY = os.getpid()
HERE = os.path.dirname(os.path.abspath(__file__))
HERE_PATH = Path(__file__).parent


def pid():
    return os.getpid()


def listing():
    return sorted(name for name in os.listdir(HERE) if name.endswith(".py"))


def read_self():
    return (HERE_PATH / "stamp.py").read_text()[:20]
"""

PROGRAM = """
import stamp
return {"preloaded": stamp.IMPORTED_BY != stamp.pid(), "listing": stamp.listing(), "here": stamp.HERE,
        "read": stamp.read_self(), "imported_by": stamp.IMPORTED_BY}
"""


class StampEnvironments(EnvFactory):
    """Environments holding ``stamp`` (A: stamp; B: stamp and six), built offline from the wheelhouse."""

    def __init__(self, root: Path, wheelhouse: Path) -> None:
        super().__init__(root, wheelhouse, {"stamp": STAMP})

    def stamp_mount(self, sandbox: Sandbox, requirements: tuple[str, ...]) -> EnvironmentMount:
        return self.mount(target_for(sandbox, "subprocess", self.targets), requirements, ("stamp",))


@pytest.fixture(scope="module")
def stamp_envs(tmp_path_factory: pytest.TempPathFactory) -> StampEnvironments:
    return StampEnvironments(tmp_path_factory.mktemp("stampenvs"), require_wheelhouse())


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1, env_zygotes_max=2)) as sb:
        yield sb


def _env_zygotes(sandbox: Sandbox) -> list[dict[str, object]]:
    backend = sandbox._backend("subprocess")  # which zygote served is the point of the test
    assert isinstance(backend, SubprocessBackend)
    return backend.env_zygotes.describe()


@pytest.mark.parametrize("kept", [pytest.param(2, marks=needs_zygotes), 0], ids=["env-zygotes", "none"])
def test_a_declared_module_is_imported_before_the_run_and_sees_its_mount(
    stamp_envs: StampEnvironments, kept: int
) -> None:
    """With environment zygotes the module was imported by another process (the zygote), yet the paths it
    recorded at import are the mount the runner reads from (its own directory, listed and read through the
    tripwire as library code); with none kept, the runner imports it itself, as before."""
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1, env_zygotes_max=kept)) as sb:
        mount = stamp_envs.stamp_mount(sb, ("stamp",))
        outcomes = [sb.execute(ExecutionRequest(code=PROGRAM, environment=mount)) for _ in range(3)]
        zygotes = _env_zygotes(sb)
    for outcome in outcomes:  # a cold worker, then warm ones from the environment's pool
        assert outcome.ok, (outcome.error_type, outcome.error_message, outcome.stderr[-2000:])
        assert outcome.value["preloaded"] is (kept > 0)
        assert outcome.value["here"] == ENV_MOUNT_PATH
        assert outcome.value["listing"] == ["stamp.py"]
        assert outcome.value["read"].startswith("\nimport os")
    if kept:
        assert [(z["env_id"], z["modules"]) for z in zygotes] == [(mount.env_id, ["stamp"])]
        assert {o.value["imported_by"] for o in outcomes} == {zygotes[0]["pid"]}
    else:
        assert zygotes == []


@needs_zygotes
def test_each_environment_runs_in_its_own_zygotes_children(stamp_envs: StampEnvironments, sandbox: Sandbox) -> None:
    """Programs of environments A and B, interleaved: each run's module was imported by its own
    environment's zygote, never the other's."""
    mount_a, mount_b = stamp_envs.stamp_mount(sandbox, ("stamp",)), stamp_envs.stamp_mount(sandbox, ("stamp", "six"))
    assert mount_a.env_id != mount_b.env_id
    seen: dict[str, set[object]] = {mount_a.env_id: set(), mount_b.env_id: set()}
    for mount in (mount_a, mount_b, mount_a, mount_b):
        outcome = sandbox.execute(ExecutionRequest(code=PROGRAM, environment=mount))
        assert outcome.ok and outcome.value["preloaded"], (outcome.error_type, outcome.error_message)
        seen[mount.env_id].add(outcome.value["imported_by"])
    pids = {str(z["env_id"]): z["pid"] for z in _env_zygotes(sandbox)}
    assert seen == {mount_a.env_id: {pids[mount_a.env_id]}, mount_b.env_id: {pids[mount_b.env_id]}}


@needs_zygotes
def test_a_zygote_of_environment_a_forks_no_runner_for_b_or_for_none(stamp_envs: StampEnvironments) -> None:
    """Asked directly (past the backend's own choice), A's zygote refuses to fork a runner for B, or for a
    program with no environment: the worker is unavailable, not started with A's modules loaded."""
    config = SandboxConfig(backend="subprocess", pool_size=0, env_zygotes_max=2)
    with Sandbox(config) as sb:
        env_a = check_mount(stamp_envs.stamp_mount(sb, ("stamp",)))
        env_b = check_mount(stamp_envs.stamp_mount(sb, ("stamp", "six")))
    backend = SubprocessBackend(config)
    try:
        limits = Limits()
        zygote_a = backend.env_zygotes.get(limits, env_a)
        assert zygote_a is not None
        for other in (env_b, None):
            with pytest.raises(SandboxUnavailable, match=f"pre-imported environment {env_a.env_id}"):
                SubprocessWorker(config, limits, backend.runner, zygote_a, other)
        SubprocessWorker(config, limits, backend.runner, zygote_a, env_a).destroy()  # its own: served
    finally:
        backend.close()


def test_a_runner_with_another_environment_preloaded_reports_its_mount_missing(
    stamp_envs: StampEnvironments, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's own layer under the zygote's refusal: a runner whose process pre-imported environment A
    reports B's mount (or a mount where none was asked for) as ``missing``, which ``require_mounted`` refuses."""
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        env_b = check_mount(stamp_envs.stamp_mount(sb, ("stamp", "six")))
    monkeypatch.setattr(envmodules, "PRELOADED", ["a" * 32])
    assert envmodules.mount_status({"environment": env_b.boot(bind=True).model_dump()}) == "missing"
    assert envmodules.mount_status({}) == "missing"
    ready = ReadyFrame(type="ready", version=1, pid=1, protections={}, environment="missing")
    for asked, message in ((env_b, "does not show environment"), (None, "nobody asked for")):
        with pytest.raises(SandboxUnavailable, match=message):
            require_mounted("subprocess", asked, ready, None)


@pytest.mark.slow
@needs_zygotes
def test_a_preimported_numpy_and_pandas_withhold_what_an_imported_one_does(index_envs: IndexEnvironments) -> None:
    """numpy, pandas and pyyaml imported in the environment zygote before any runner exists: every loader
    attack is still stopped by its layer (withheld names by identity, the wrappers, the disarmed methods,
    the unpickling floor that pandas bound at import)."""
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1, env_zygotes_max=2)) as sb:
        mount = index_envs.mount(sb, "subprocess")
        assert_every_attack_stopped(sb, mount)
        assert [z["env_id"] for z in _env_zygotes(sb)] == [mount.env_id]


@needs_zygotes
def test_at_most_env_zygotes_max_are_kept_least_recently_used_closed_first(stamp_envs: StampEnvironments) -> None:
    """With a bound of one, B's zygote evicts A's (which forks nothing more, and ends once a run it may have
    started is over, or with the sandbox); A's next run builds A's again."""
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0, env_zygotes_max=1)) as sb:
        mount_a, mount_b = stamp_envs.stamp_mount(sb, ("stamp",)), stamp_envs.stamp_mount(sb, ("stamp", "six"))
        imported_by = []
        for mount in (mount_a, mount_b, mount_a):
            outcome = sb.execute(ExecutionRequest(code=PROGRAM, environment=mount))
            assert outcome.ok and outcome.value["preloaded"], (outcome.error_type, outcome.error_message)
            imported_by.append(outcome.value["imported_by"])
            assert [z["env_id"] for z in _env_zygotes(sb)] == [mount.env_id]
        assert len(set(imported_by)) == 3  # three zygotes, one after another
    assert all(_zombie_or_gone(int(pid)) for pid in imported_by)


def _zombie_or_gone(pid: int) -> bool:
    """The process has ended (gone, or a zombie: its parent has not waited for it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize("execution_waiting", [False, True], ids=["idle", "taken-at-once"])
def test_a_runner_warms_up_again_while_no_execution_comes(
    monkeypatch: pytest.MonkeyPatch, execution_waiting: bool
) -> None:
    """``preload.rewarm``: a runner of an environment zygote that no execution took within ``REWARM_AFTER_S``
    runs its zygote's warm-ups once more (the pages their first use writes become its own while it waits);
    one whose execute frame is already there does not (the run must not wait for it)."""
    probe = types.ModuleType("sandforge_probe")
    monkeypatch.setitem(sys.modules, "sandforge_probe", probe)
    monkeypatch.setitem(preload.WARMUPS, "sandforge_probe", "module.warmed = getattr(module, 'warmed', 0) + 1\n")
    monkeypatch.setattr(preload, "WARMED", ["sandforge_probe"])
    read_fd, write_fd = os.pipe()
    try:
        if execution_waiting:
            os.write(write_fd, b"{}")
        preload.rewarm(read_fd)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert getattr(probe, "warmed", 0) == (0 if execution_waiting else 1)
