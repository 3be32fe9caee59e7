"""Shared fixtures. Container tests skip without an engine, and fail under SANDFORGE_REQUIRE_DOCKER=1.

- ``docker_env`` (session): a Docker API client with the sandbox image ensured (built once when missing).
- ``sandbox_backend``: each backend name in turn (``subprocess``, ``docker``, ``gvisor``, ``runc``,
  ``runsc``), marked and skipped (or failed) as the machine requires; ``sandbox``: a Sandbox on it with a
  small warm pool.
- Any test marked ``@pytest.mark.docker`` / ``@pytest.mark.gvisor`` / ``@pytest.mark.oci`` gets the same
  requirement check. The OCI backends (runc/runsc driven directly) need root, the runtime binary and the
  image unpacked by ``image.build`` (the probe builds and unpacks it once).
- The slowest test files run first (``tests/durations.py``), so under xdist no worker is left alone at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

import sandforge.sandbox as sandbox_package
from sandforge.sandbox import Sandbox, SandboxConfig, seam
from tests import durations

if TYPE_CHECKING:
    from sandforge.runtime.agent import Workspace

REQUIRE_DOCKER = os.environ.get("SANDFORGE_REQUIRE_DOCKER") == "1"


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """The slowest files first, each file's tests together and in their order (a stable sort by file); under
    ``--dist loadgroup`` the tests of a file with a module-scoped set-up (a Ray cluster, a server) or run whole
    in a network namespace stay on one worker, which sets it up (or runs it) once."""
    seconds = durations.load()
    if seconds:
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))
    for item in items:
        if item.get_closest_marker("xdist_group") is None and durations.one_worker(item):  # a file's own group wins
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    yield
    durations.keep_xdist_groups(items)


@dataclass
class DockerEnv:
    """What the container tests need: an API client, the image tag, and why a backend cannot run here."""

    api: Any = None
    tag: str = ""
    problems: dict[str, str] = field(default_factory=dict)

    def reason(self, backend: str) -> str | None:
        return self.problems.get(backend) or self.problems.get("engine")


def _probe_docker() -> DockerEnv:
    """Connect, make sure the expected image exists (building it once if needed), check the runtimes."""
    env = DockerEnv()
    try:
        from sandforge.sandbox import image
        from sandforge.sandbox.docker_engine import connect
        from sandforge.sandbox.errors import SandboxUnavailable
    except ImportError as exc:
        env.problems["engine"] = f"docker backend not importable: {exc}"
        return env
    env.tag = image.expected_tag(SandboxConfig().image)
    try:
        env.api = connect(SandboxConfig.from_env().docker_base_url)
    except SandboxUnavailable as exc:
        env.problems["engine"] = str(exc)
        return env
    try:
        if not image.status(env.api).present:
            image.build(env.api)  # idempotent and locked: parallel test workers build it once (and unpack it)
        image.export_rootfs(env.api, env.tag, lambda _msg: None)  # for runc/runsc; a no-op when present
    except Exception as exc:  # no root, no debootstrap, no mirror...: report it as the reason
        env.problems["engine"] = f"sandbox image {env.tag} missing and could not be built: {exc}"
        return env
    runtimes = env.api.info().get("Runtimes") or {}
    if "runsc" not in runtimes:
        env.problems["gvisor"] = f"no runsc runtime registered with Docker (have: {', '.join(sorted(runtimes))})"
    return env


_DOCKER_ENV: DockerEnv | None = None


def _docker_env() -> DockerEnv:
    global _DOCKER_ENV
    if _DOCKER_ENV is None:
        _DOCKER_ENV = _probe_docker()
    return _DOCKER_ENV


def container_unavailable(backend: str) -> str | None:
    """Why the given container backend cannot run here, or None when it can."""
    if backend == "subprocess":
        return None
    reason = _docker_env().reason(backend)  # the OCI backends use the image the engine built
    if reason is None and backend in ("runc", "runsc"):
        from sandforge.sandbox.backends.oci_backend import OciBackend

        reason = OciBackend(SandboxConfig(), runtime=backend).unavailable_reason()  # type: ignore[arg-type]
    return reason


def _require_backend(backend: str) -> None:
    reason = container_unavailable(backend)
    if reason is None:
        return
    if REQUIRE_DOCKER:
        pytest.fail(f"{backend} backend required (SANDFORGE_REQUIRE_DOCKER=1) but unavailable: {reason}")
    pytest.skip(f"{backend} backend unavailable: {reason}")


@pytest.fixture(scope="session")
def docker_env() -> Iterator[DockerEnv]:
    """The Docker engine and the sandbox image; skips (fails under SANDFORGE_REQUIRE_DOCKER=1) without them."""
    _require_backend("docker")
    env = _docker_env()
    yield env


@pytest.fixture(autouse=True)
def _container_requirements(request: pytest.FixtureRequest) -> None:
    """Tests marked docker/gvisor skip, or fail when required, where the engine or runtime is missing."""
    oci = request.node.get_closest_marker("oci")
    if oci is not None:
        for runtime in oci.args or ("runc",):
            _require_backend(runtime)
    if request.node.get_closest_marker("gvisor") is not None:
        _require_backend("gvisor")
    elif request.node.get_closest_marker("docker") is not None:
        _require_backend("docker")


#: Every backend as a fixture parameter, marked with what it needs (for fixtures of other scopes too).
BACKEND_PARAMS = [
    "subprocess",
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor]),
    pytest.param("runc", marks=pytest.mark.oci("runc")),
    pytest.param("runsc", marks=pytest.mark.oci("runsc")),
]


@pytest.fixture(params=BACKEND_PARAMS)
def sandbox_backend(request: pytest.FixtureRequest) -> str:
    """Each backend name in turn; container backends skip (or fail, when required) without an engine."""
    backend: str = request.param
    _require_backend(backend)
    return backend


class SharedSandboxes:
    """One Sandbox (warm pool of one) per backend for the whole run of this worker, closed at its end."""

    def __init__(self) -> None:
        self._made: dict[str, Sandbox] = {}

    def get(self, backend: str) -> Sandbox:
        sb = self._made.get(backend)
        if sb is None:
            sb = self._made[backend] = Sandbox(SandboxConfig(backend=backend, pool_size=1))
        return sb

    def close(self) -> None:
        for sb in self._made.values():
            sb.close()

    def settle(self, timeout_s: float = 20.0) -> None:
        """Wait for the tear-downs and refills the last test's executions started: a worker that ends or starts
        during the next test would show among that test's processes, descriptors, directories or containers."""
        sandbox_package._AFTER_RUN.drain()
        deadline = time.monotonic() + 3 * timeout_s  # within the tests' 120 s time-out, however many pools wait
        for sb in self._made.values():
            for pool in list(sb._pools.values()):
                if not pool.retired:  # an environment's pool unused for a while retires: it never fills again
                    pool.wait_ready(timeout=min(timeout_s, max(0.0, deadline - time.monotonic())))


@pytest.fixture(scope="session")
def shared_sandboxes() -> Iterator[SharedSandboxes]:
    """This worker's Sandboxes shared across tests (``sandbox``; fixtures that wrap one take it from here)."""
    shared = SharedSandboxes()
    yield shared
    shared.close()


@pytest.fixture(autouse=True)
def _shared_sandboxes_settle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the shared Sandboxes, their pools are full again before the next test starts."""
    shared = request.getfixturevalue("shared_sandboxes") if "shared_sandboxes" in request.fixturenames else None
    yield
    if shared is not None:
        shared.settle()


@pytest.fixture
def without_shared_sandboxes(shared_sandboxes: SharedSandboxes) -> Iterator[None]:
    """This worker's shared Sandboxes closed before and after the test: for a test that lists what this process
    leaves on the host (work, hand-off and mount directories, containers), where their warm workers would show."""
    shared_sandboxes.close()
    yield
    shared_sandboxes.close()


@pytest.fixture(autouse=True)
def _no_shared_worker_under_a_seam(request: pytest.FixtureRequest) -> None:
    """A test that may set ``seam.ACTIVE`` (its module imports the seam; it takes ``monkeypatch``) runs without
    this worker's shared Sandboxes: a warm worker started while a seam is set carries it in its boot frame, and
    a later test must never be handed one."""
    if "monkeypatch" in request.fixturenames and getattr(request.module, "seam", None) is seam:
        request.getfixturevalue("without_shared_sandboxes")


@pytest.fixture
def sandbox(sandbox_backend: str, shared_sandboxes: SharedSandboxes) -> Sandbox:
    """A Sandbox on the backend under test with a warm pool of one, shared by this worker's tests as a deployment
    shares one across its executions: every execution still gets a fresh worker, never reused, and each test
    finds one already warm instead of starting a pool (and a refill nobody takes) of its own: on gVisor one
    start costs ~0.5 s of CPU. A test that closes it leaves the next one a Sandbox that reopens its pools."""
    return shared_sandboxes.get(sandbox_backend)


@pytest.fixture
def workspaces() -> Iterator[list[Workspace]]:
    """Workspaces a test makes (append them): closed after the test."""
    made: list[Workspace] = []
    yield made
    for ws in made:
        ws.close()


@pytest.fixture(scope="session", autouse=True)
def _call_log_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``sandforge exec`` records every run in the call log (issue 37), as a Workspace without ``log=`` records
    its calls: a test run writes them to a temporary file, never to the user's state directory. Tests that
    need the default unset ``SANDFORGE_CALL_LOG`` themselves."""
    if os.environ.get("SANDFORGE_CALL_LOG"):
        yield
        return
    os.environ["SANDFORGE_CALL_LOG"] = str(tmp_path_factory.mktemp("call-log") / "calls.jsonl")
    try:
        yield
    finally:
        os.environ.pop("SANDFORGE_CALL_LOG", None)
