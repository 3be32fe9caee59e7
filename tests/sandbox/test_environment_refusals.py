"""A request's environment is checked against the environment's own files before anything is mounted: a
missing, forged or tampered one is refused in one typed line (invalid_request) and no sandbox is started;
a sandbox started for one environment never runs a program of another; idle environment pools retire."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.environment import EnvironmentRefused, check_mount
from sandforge.sandbox.protocol import ErrorType
from sandforge.sandbox.steps import run_steps
from tests.environments.helpers import require_wheelhouse
from tests.sandbox.envbuild import EnvFactory, target_for

DATEUTIL = ("python-dateutil",)
SOUP = ("beautifulsoup4",)


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> EnvFactory:
    return EnvFactory(tmp_path_factory.mktemp("envs"), require_wheelhouse())


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1))
    try:
        yield sb
    finally:
        sb.close()


def _mount(factory: EnvFactory, sandbox: Sandbox, requirements: tuple[str, ...]) -> EnvironmentMount:
    return factory.mount(target_for(sandbox, "subprocess", factory.targets), requirements)


def _copy_env(mount: EnvironmentMount, root: Path, env_id: str | None = None) -> Path:
    """A copy of the environment's directory under ``root`` (named ``env_id``, default its own)."""
    source = Path(mount.site).parent
    copy = root / (env_id or mount.env_id)
    shutil.copytree(source, copy, symlinks=True)
    return copy


def _refused(sandbox: Sandbox, mount: EnvironmentMount, needle: str) -> None:
    outcome = sandbox.execute(ExecutionRequest(code="return 1", environment=mount))
    assert outcome.error_type == ErrorType.INVALID_REQUEST, outcome
    assert outcome.retriable is False
    message = outcome.error_message or ""
    assert "\n" not in message and needle in message, message
    assert mount.env_id not in sandbox.env_pools()  # refused before any pool or worker exists


def test_missing_and_forged_environments_are_refused(factory: EnvFactory, sandbox: Sandbox, tmp_path: Path) -> None:
    real = _mount(factory, sandbox, DATEUTIL)
    other_id = "f" * 32

    def forged(**fields: object) -> EnvironmentMount:
        return real.model_copy(update=fields)

    _refused(sandbox, forged(site=str(tmp_path / real.env_id / "site")), "is not ready")  # missing
    _refused(sandbox, forged(site="/etc"), "is not the site directory")
    _refused(sandbox, forged(env_id=other_id), "is not the site directory")  # another id, same path
    _refused(sandbox, forged(site=real.site + "/../site"), "free of symlinks")
    _refused(sandbox, forged(site="relative/" + real.env_id + "/site"), "absolute path")
    link = tmp_path / "links" / real.env_id
    link.parent.mkdir()
    link.symlink_to(Path(real.site).parent)  # a symlink planted where an environment should be
    _refused(sandbox, forged(site=str(link / "site")), "free of symlinks")
    _refused(sandbox, forged(modules=("dateutil", "bs4")), "does not provide bs4")  # not in this environment
    # A copy renamed to another id: its record names the real id.
    renamed = _copy_env(real, tmp_path / "renamed", other_id)
    _refused(sandbox, forged(env_id=other_id, site=str(renamed / "site")), "another environment's")
    # A directory with a site but no ready marker (a build in progress, a hand-made tree).
    unready = _copy_env(real, tmp_path / "unready")
    (unready / "environment.json").unlink()
    _refused(sandbox, forged(site=str(unready / "site")), "is not ready")
    # A site that others may write into, or that holds a uv cache.
    loose = _copy_env(real, tmp_path / "loose")
    (loose / "site").chmod(0o777)
    _refused(sandbox, forged(site=str(loose / "site")), "writable by another user")
    cached = _copy_env(real, tmp_path / "cached")
    (cached / "site" / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55")
    _refused(sandbox, forged(site=str(cached / "site")), "uv cache")
    # A record whose provides were edited after the check was remembered: the new record is read again.
    edited = _copy_env(real, tmp_path / "edited")
    check_mount(forged(site=str(edited / "site")))
    record = edited / "environment.json"
    record.write_text(record.read_text().replace('"dateutil"', '"notdateutil"'))
    os.utime(record, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(EnvironmentRefused, match="does not provide dateutil"):
        check_mount(forged(site=str(edited / "site")))
    # The real one still runs.
    assert sandbox.execute(ExecutionRequest(code="import dateutil\nreturn 1", environment=real)).ok


def test_reserved_names_cannot_shadow_the_sandboxs_modules() -> None:
    with pytest.raises(ValueError, match="pattern"):
        EnvironmentMount(env_id="a" * 32, site="/x/site", modules=("_private",))
    with pytest.raises(ValueError, match="pattern"):
        EnvironmentMount(env_id="not-an-id", site="/x/site")


def test_a_pool_never_mixes_environments(factory: EnvFactory, sandbox: Sandbox) -> None:
    dates, soup = _mount(factory, sandbox, DATEUTIL), _mount(factory, sandbox, SOUP)
    assert dates.env_id != soup.env_id
    import_dates, import_soup = "import dateutil\nreturn 'dates'", "import bs4\nreturn 'soup'"
    for _ in range(3):  # alternating, each from its own warm pool
        assert sandbox.execute(ExecutionRequest(code=import_dates, environment=dates)).value == "dates"
        assert sandbox.execute(ExecutionRequest(code=import_soup, environment=soup)).value == "soup"
        crossed = sandbox.execute(ExecutionRequest(code=import_soup, environment=dates))
        assert crossed.error_type == ErrorType.SANDBOX_VIOLATION  # dates' sandboxes have no bs4
        none = sandbox.execute(ExecutionRequest(code=import_dates))
        assert none.error_type == ErrorType.SANDBOX_VIOLATION  # neither has the plain pool
    assert sandbox.env_pools() == sorted([dates.env_id, soup.env_id])
    # A worker of one environment handed a program of another: the host refuses before sending it...
    checked_dates, checked_soup = check_mount(dates), check_mount(soup)
    pool = sandbox.pool("subprocess", None, checked_dates)
    assert pool.wait_ready(1, timeout=30)
    worker = pool.acquire()
    assert worker.environment == checked_dates  # type: ignore[attr-defined]
    request = ExecutionRequest(code=import_soup, environment=soup)
    outcome = run_steps(sandbox.run_steps(worker, request, None, checked_soup))
    assert outcome.error_type == ErrorType.SANDBOX_UNAVAILABLE
    assert "another environment" in (outcome.error_message or "")
    assert not worker.alive()
    # ... and the runner refuses one that reaches it anyway (its execute frame names another environment).
    worker = pool.acquire()
    outcome = worker.execute(ExecutionRequest(code=import_dates, environment=soup), None)
    assert outcome.error_type == ErrorType.INVALID_REQUEST and "another environment" in (outcome.error_message or "")
    worker = sandbox.pool("subprocess").acquire()  # a worker with no environment
    outcome = worker.execute(ExecutionRequest(code="return 1", environment=dates), None)
    assert outcome.error_type == ErrorType.INVALID_REQUEST


def test_idle_environment_pools_retire(factory: EnvFactory) -> None:
    config = SandboxConfig(backend="subprocess", pool_size=1, env_pool_idle_s=0.5, env_pools_max=1)
    with Sandbox(config) as sandbox:
        dates, soup = _mount(factory, sandbox, DATEUTIL), _mount(factory, sandbox, SOUP)
        assert sandbox.execute(ExecutionRequest(code="return 1", environment=dates)).ok
        pool = sandbox.pool("subprocess", None, dates)
        deadline = time.monotonic() + 30
        while not pool.retired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.retired and pool.ready_count() == 0  # unused: stopped refilling, its workers destroyed
        assert sandbox.env_pools() == []
        assert sandbox.execute(ExecutionRequest(code="return 1", environment=dates)).ok  # a fresh pool
        assert sandbox.pool("subprocess", None, dates) is not pool
        assert sandbox.execute(ExecutionRequest(code="return 2", environment=soup)).value == 2
        assert sandbox.env_pools() == [soup.env_id]  # at most env_pools_max: the least recently used went
        plain = sandbox.pool("subprocess")
        assert plain.retire_idle_s is None  # the pool without an environment never retires


@pytest.mark.parametrize(
    "code",
    ["from json import decoder\nreturn str(decoder)", "from xml.etree import ElementPath\nreturn 1",
     "from html import entities\nreturn 1"],
)  # fmt: skip
def test_from_imports_never_fall_back_to_real_modules(sandbox: Sandbox, code: str) -> None:
    """``from json import decoder`` read ``json.decoder`` from ``sys.modules`` when the proxy lacked it: the
    real module. Every name of a from-import now comes from the proxy or the import fails."""
    outcome = sandbox.execute(ExecutionRequest(code=code))
    assert outcome.error_type == ErrorType.SANDBOX_VIOLATION, outcome.value
    assert "is not allowed in the sandbox" in (outcome.error_message or "")
    assert sandbox.execute(ExecutionRequest(code="from math import nothing_here\nreturn 1")).error_type == "execution"
