"""Issue 19 in the sandbox: a ready environment (built from the wheelhouse by runtime/environments for the
backend's own interpreter) is mounted read-only at /sandforge/env on every backend; the program imports the
declared top-level modules through proxies and nothing else of it; writes into the mount fail and leave the
host's files as they were; the uv cache is not there."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig, seam
from sandforge.sandbox.protocol import ENV_MOUNT_PATH, BootSeam, ErrorType
from tests.conftest import _docker_env
from tests.environments.helpers import require_wheelhouse
from tests.sandbox.envbuild import EnvFactory, target_for

REQUIREMENTS = ("python-dateutil", "beautifulsoup4", "envprobe")

USES_ALL = """
from dateutil import parser
import dateutil.tz
import bs4
import envprobe
soup = bs4.BeautifulSoup("<p><i>x</i></p>", "html.parser")
return {
    "date": parser.parse("2024-02-29T10:00:00+01:00").astimezone(dateutil.tz.UTC).isoformat(),
    "soup": soup.select_one("p > i").text,
    "where": envprobe.where(),
    "listing": envprobe.listing(),
    "writes": envprobe.attempt_writes(),
    "cache_visible": envprobe.exists(args[0]),
    "host_site_visible": envprobe.exists(args[1]),
}
"""


@pytest.fixture(scope="session")
def env_factory(tmp_path_factory: pytest.TempPathFactory) -> EnvFactory:
    return EnvFactory(tmp_path_factory.mktemp("envs"), require_wheelhouse())


@pytest.fixture
def env_sandbox(sandbox_backend: str) -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend=sandbox_backend, pool_size=1))  # type: ignore[arg-type]
    try:
        yield sb
    finally:
        sb.close()


def _api(backend: str) -> Any:
    return None if backend == "subprocess" else _docker_env().api


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tripwire_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' seam: runners without the tripwire, so the package's write attempts reach the OS wall (the
    read-only mount) and this test shows that wall alone. Listed before ``env_sandbox``: the boot frame
    carries the seam when the pool's worker starts."""
    monkeypatch.setattr(seam, "ACTIVE", BootSeam(tripwire_off=True))


def test_every_backend_imports_declared_packages_and_cannot_write(
    tripwire_off: None, env_factory: EnvFactory, env_sandbox: Sandbox, sandbox_backend: str
) -> None:
    target = target_for(env_sandbox, sandbox_backend, env_factory.targets, _api(sandbox_backend))
    mount = env_factory.mount(target, REQUIREMENTS)
    site = Path(mount.site)
    before = {p: _digest(p) for p in (site / "dateutil" / "__init__.py", site / "envprobe.py")}
    mode = (site / "envprobe.py").stat().st_mode
    cache = str(env_factory.store.root / "cache")
    for _ in range(2):  # a cold worker, then one from the environment's warm pool
        outcome = env_sandbox.execute(ExecutionRequest(code=USES_ALL, args=[cache, mount.site], environment=mount))
        assert outcome.ok, (outcome.error_type, outcome.error_message, outcome.stderr[-2000:])
        value: Any = outcome.value
        assert value["date"] == "2024-02-29T09:00:00+00:00"
        assert value["soup"] == "x"
        assert value["where"] == ENV_MOUNT_PATH
        assert "dateutil" in value["listing"] and "envprobe.py" in value["listing"]
        assert not {"CACHEDIR.TAG", ".lock", "cache"} & set(value["listing"])  # the uv cache never enters
        assert value["cache_visible"] is False and value["host_site_visible"] is False
        assert set(value["writes"]) == {"new_file", "existing", "mkdir", "chmod", "unlink"}
        assert "wrote" not in value["writes"].values(), value["writes"]
        assert set(value["writes"].values()) <= {"EROFS", "EACCES", "EPERM"}, value["writes"]
        assert outcome.metadata["env_id"] == mount.env_id
    assert {p: _digest(p) for p in before} == before  # the host's files are untouched
    assert (site / "envprobe.py").stat().st_mode == mode
    assert not (site / "planted.py").exists() and not (site / "newdir").exists()
    assert env_sandbox.env_pools() == [mount.env_id]


def test_a_package_writing_at_run_time_trips_the_tripwire(
    env_factory: EnvFactory, env_sandbox: Sandbox, sandbox_backend: str
) -> None:
    """With the tripwire on (always, outside the tests' seam), a package that tries to write at run time
    ends the execution at its first attempt, before the OS wall is even asked; importing it did not trip."""
    target = target_for(env_sandbox, sandbox_backend, env_factory.targets, _api(sandbox_backend))
    mount = env_factory.mount(target, REQUIREMENTS)
    imports = env_sandbox.execute(ExecutionRequest(code="import envprobe\nimport bs4\nreturn 1", environment=mount))
    assert imports.ok, (imports.error_type, imports.error_message)
    writes = env_sandbox.execute(
        ExecutionRequest(code="import envprobe\nreturn envprobe.attempt_writes()", environment=mount)
    )
    assert writes.error_type == ErrorType.SANDBOX_VIOLATION, (writes.error_type, writes.error_message)
    assert writes.security_event is not None and writes.security_event.source == "tripwire"
    assert writes.security_event.event in {"open", "os.mkdir", "os.chmod", "os.remove"}


def test_only_the_declared_modules_are_exposed(
    env_factory: EnvFactory, env_sandbox: Sandbox, sandbox_backend: str
) -> None:
    target = target_for(env_sandbox, sandbox_backend, env_factory.targets, _api(sandbox_backend))
    mount = env_factory.mount(target, REQUIREMENTS, modules=("dateutil", "envprobe"))

    def run(code: str) -> Any:
        return env_sandbox.execute(ExecutionRequest(code=code, environment=mount))

    ok = run("import dateutil.relativedelta as rd\nreturn rd.relativedelta(months=1).months")
    assert ok.ok and ok.value == 1, ok.error_message
    for code in ("import bs4\nreturn 1", "import soupsieve\nreturn 1", "import six\nreturn 1"):
        refused = run(code)  # installed in the environment, but not exposed to this program
        assert refused.error_type == ErrorType.SANDBOX_VIOLATION, (code, refused.error_message)
    hidden = run("import envprobe\nreturn [hasattr(envprobe, n) for n in ('os', 'errno', 'where')]")
    assert hidden.ok and hidden.value == [False, False, True]  # other packages' modules are not reachable
    private = run("from dateutil import _common\nreturn 1")
    assert private.error_type == ErrorType.SANDBOX_VIOLATION
    without = env_sandbox.execute(ExecutionRequest(code="import dateutil\nreturn 1"))
    assert without.error_type == ErrorType.SANDBOX_VIOLATION  # no environment, no third-party module
