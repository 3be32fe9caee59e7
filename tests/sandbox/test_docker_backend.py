"""Container-specific behaviour of the docker (runc) and gvisor (runsc) backends.

The behaviour every backend shares (contract, limits, attacks) is in test_isolation.py; here: how the
containers are configured, removed, inspected and replaced, and what happens when the engine, the image or
the runtime is missing.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox, SandboxConfig, handoff
from sandforge.sandbox.backends.docker_backend import LABEL, OWNER_LABEL, ContainerWorker, DockerBackend, reap_leftovers
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.ownership import process_tag
from sandforge.sandbox.protocol import BootFrame
from tests.conftest import DockerEnv

#: These tests list what this process leaves on the host: no shared Sandbox's warm worker may show there.
pytestmark = pytest.mark.usefixtures("without_shared_sandboxes")

CONTAINER_BACKENDS = [
    pytest.param(None, marks=pytest.mark.docker, id="docker"),
    pytest.param("runsc", marks=[pytest.mark.docker, pytest.mark.gvisor], id="gvisor"),
]


@pytest.fixture(params=CONTAINER_BACKENDS)
def backend(request: pytest.FixtureRequest, docker_env: DockerEnv) -> Iterator[DockerBackend]:
    be = DockerBackend(SandboxConfig(), runtime=request.param)
    try:
        yield be
    finally:
        be.close()


def gone(api: Any, container_id: str, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.05)
    return False


def owned_by(api: Any, owner: str) -> list[str]:
    return [c["Id"] for c in api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})]


# --- configuration and protections ---------------------------------------------------------------


def test_container_is_locked_down(
    backend: DockerBackend, docker_env: DockerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFORGE_TEST_SECRET", "hunter2")
    limits = Limits(memory_mb=96, disk_mb=8, max_processes=12, cpus=0.5)
    worker = backend.spawn(limits)
    try:
        attrs = docker_env.api.inspect_container(worker.id)
        hc, cfg = attrs["HostConfig"], attrs["Config"]
        assert hc["NetworkMode"] == "none"
        assert hc["ReadonlyRootfs"] is True
        assert hc["CapDrop"] == ["ALL"] and not hc["CapAdd"] and not hc["Privileged"]
        assert "no-new-privileges" in hc["SecurityOpt"]
        assert cfg["User"] == "65534:65534"
        assert hc["Memory"] == hc["MemorySwap"] > 0
        assert hc["PidsLimit"] >= limits.max_processes
        assert hc["NanoCpus"] == 500_000_000
        assert hc["IpcMode"] == "none"
        assert hc["Tmpfs"]["/tmp"].startswith("size=8m") and "noexec" in hc["Tmpfs"]["/tmp"]
        assert hc["LogConfig"]["Type"] == "none"
        assert cfg["Labels"][LABEL] == "1" and cfg["Labels"][OWNER_LABEL] == backend.owner
        assert not any("hunter2" in e or e.startswith("SANDFORGE") for e in cfg["Env"] or [])
        assert (hc.get("Runtime") == "runsc") == (backend.runtime == "runsc")
        if backend.runtime is None:
            assert hc["Memory"] == 96 * 1024 * 1024 and hc["PidsLimit"] == 12
        for name in ("network_none", "read_only_rootfs", "capabilities_dropped", "no_new_privs", "unprivileged_user",
                     "memory_limit", "no_swap", "pids_limit", "cpu_limit", "seccomp", "rlimits"):  # fmt: skip
            assert worker.protections[name], name
        assert worker.protections.get("gvisor", False) == (backend.runtime == "runsc")
    finally:
        worker.destroy()


@pytest.mark.docker
@pytest.mark.skipif("DOCKER_HOST" in os.environ, reason="needs the engine's processes visible in this /proc")
def test_runc_lockdown_is_verified_from_the_host(docker_env: DockerEnv) -> None:
    """Under runc the runner's own claims (seccomp, no_new_privs, rlimits) are checked in /proc."""
    backend = DockerBackend(SandboxConfig())
    try:
        worker = backend.spawn(Limits())
        try:
            assert worker.verified_from_host
            assert worker.protections["seccomp"] and worker.protections["rlimits"]
        finally:
            worker.destroy()
    finally:
        backend.close()


def test_program_runs_in_the_container(backend: DockerBackend) -> None:
    worker = backend.spawn(Limits())
    out = worker.execute(ExecutionRequest(code="context['k'] = 'v'\nprint('hi')\nreturn sum(args)", args=[1, 2]), None)
    assert out.ok, out.error_message
    assert out.value == 3 and out.context == {"k": "v"} and out.stdout == "hi\n"
    assert out.backend == backend.name and out.metadata["container_id"] == worker.id[:12]
    assert not worker.alive()


# --- removal -------------------------------------------------------------------------------------


def test_container_removed_after_execution(backend: DockerBackend, docker_env: DockerEnv) -> None:
    ids = []
    for code in ("return 1", "raise ValueError('x')", "while True:\n    pass"):
        worker = backend.spawn(Limits(timeout_s=1))
        ids.append(worker.id)
        worker.execute(ExecutionRequest(code=code, limits=Limits(timeout_s=1)), None)
    for cid in ids:
        assert gone(docker_env.api, cid), f"container {cid[:12]} still exists"
    backend.close()
    assert owned_by(docker_env.api, backend.owner) == []
    assert handoff_dirs(process_tag()) == []


def handoff_dirs(tag: str) -> list[Path]:
    """Containers' hand-off directories (not the value store) of the process ``tag`` names."""
    return [p for p in handoff.base_dir().glob(f"{handoff.PREFIX}{tag}-*") if (p / "in").exists()]


def test_pool_close_removes_warm_containers(docker_env: DockerEnv) -> None:
    sb = Sandbox(SandboxConfig(backend="docker", pool_size=2))
    pool = sb.pool()
    assert pool.wait_ready(2, timeout=60), pool.last_error
    owner = sb._backend("docker").owner  # type: ignore[attr-defined]
    assert len(owned_by(docker_env.api, owner)) >= 2
    assert len(handoff_dirs(process_tag())) >= 2  # one per warm container
    sb.close()
    assert owned_by(docker_env.api, owner) == []
    assert handoff_dirs(process_tag()) == []


@pytest.mark.docker
def test_containers_removed_at_interpreter_exit(docker_env: DockerEnv) -> None:
    """A process that never closes its Sandbox leaves no containers behind."""
    script = textwrap.dedent(
        """
        from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
        from sandforge.sandbox.ownership import process_tag
        sb = Sandbox(SandboxConfig(backend="docker", pool_size=2))
        out = sb.execute(ExecutionRequest(code="return len(context['big'])", context={"big": "x" * 100_000}))
        assert out.ok, out.error_message
        assert sb.pool().wait_ready(2, timeout=60)
        print(process_tag(), flush=True)
        print(sb._backend("docker").owner, flush=True)
        # no sb.close(): the atexit handler must remove the warm containers and the used one
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr
    tag, owner = proc.stdout.strip().splitlines()[-2:]
    assert owned_by(docker_env.api, owner) == []
    assert list(handoff.base_dir().glob(f"{handoff.PREFIX}{tag}-*")) == []  # the value store too


@pytest.mark.docker
def test_leftovers_of_dead_processes_are_reaped(docker_env: DockerEnv) -> None:
    api = docker_env.api
    dead = api.create_container(
        docker_env.tag, command=["true"], labels={LABEL: "1", OWNER_LABEL: f"{platform.node()}:999999999:1.00"}
    )
    mine = DockerBackend(SandboxConfig())
    alive = api.create_container(docker_env.tag, command=["true"], labels={LABEL: "1", OWNER_LABEL: mine.owner})
    try:
        removed = reap_leftovers(api)
        assert alive["Id"] not in removed
        assert gone(api, dead["Id"], timeout=1)  # (a parallel test worker's reaper may have been first)
        api.inspect_container(alive["Id"])  # a live owner's container is left alone
    finally:
        for cid in (dead["Id"], alive["Id"]):
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(cid, force=True)
        mine.close()


# --- failures ------------------------------------------------------------------------------------


def test_cgroup_oom_kill_is_memory_limit(backend: DockerBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory the runner's address-space rlimit does not catch is stopped by the container's cgroup.

    The runner normally hits RLIMIT_AS first (MemoryError -> memory_limit); here its rlimit is lifted
    so the kernel's OOM killer ends the container, and the host reads State.OOMKilled.
    """
    original = ContainerWorker.boot_frame

    def without_rlimit(self: ContainerWorker, limits: Limits) -> BootFrame:
        return original(self, limits.model_copy(update={"memory_mb": 8192}))

    monkeypatch.setattr(ContainerWorker, "boot_frame", without_rlimit)
    limits = Limits(memory_mb=64, timeout_s=20)
    worker = backend.spawn(limits)
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(4 * 1024 * 1024))"
    out = worker.execute(ExecutionRequest(code=code, limits=limits), None)
    assert out.error_type == ErrorType.MEMORY_LIMIT, out.error_message
    assert out.metadata.get("oom_killed") is True
    assert out.context is None


def test_timeout_kills_the_container(backend: DockerBackend, docker_env: DockerEnv) -> None:
    limits = Limits(timeout_s=1, cpu_s=30)  # the wall clock, not RLIMIT_CPU, must end it
    worker = backend.spawn(limits)
    out = worker.execute(ExecutionRequest(code="while True:\n    pass", limits=limits), None)
    assert out.error_type == ErrorType.TIMEOUT and out.retriable
    assert out.metadata["signal"] == 9
    assert gone(docker_env.api, worker.id)


def test_engine_down_is_sandbox_unavailable(tmp_path: Any) -> None:
    """No docker marker: this must hold on machines without any engine too."""
    bogus = f"unix://{tmp_path}/no-such-docker.sock"
    for name in ("docker", "gvisor"):
        with Sandbox(SandboxConfig(backend=name, docker_base_url=bogus, pool_size=0)) as sb:
            out = sb.execute(ExecutionRequest(code="return 1"))
        assert out.error_type == ErrorType.SANDBOX_UNAVAILABLE and out.retriable, out
        assert "engine" in (out.error_message or "").lower()
        assert out.context is None


def test_engine_down_with_a_warm_pool(tmp_path: Any) -> None:
    bogus = f"unix://{tmp_path}/no-such-docker.sock"
    with Sandbox(SandboxConfig(backend="docker", docker_base_url=bogus, pool_size=1)) as sb:
        out = sb.execute(ExecutionRequest(code="return 1"))
    assert out.error_type == ErrorType.SANDBOX_UNAVAILABLE and out.retriable


@pytest.mark.docker
def test_missing_image_is_sandbox_unavailable_with_build_hint(docker_env: DockerEnv) -> None:
    repo = f"sandforge-test-missing-{uuid.uuid4().hex[:8]}"
    with Sandbox(SandboxConfig(backend="docker", image=repo, pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return 1"))
    assert out.error_type == ErrorType.SANDBOX_UNAVAILABLE
    assert "missing" in (out.error_message or "") and "sandforge image build" in (out.error_message or "")


@pytest.mark.docker
def test_stale_image_is_detected_not_used(docker_env: DockerEnv) -> None:
    """An image of the right repository but another runner version is never run."""
    repo = f"sandforge-test-stale-{uuid.uuid4().hex[:8]}"
    docker_env.api.tag(docker_env.tag, repo, "000000000000")
    try:
        backend = DockerBackend(SandboxConfig(image=repo))
        try:
            assert backend.tag != f"{repo}:000000000000"
            reason = backend.unavailable_reason()
            assert reason is not None and "stale" in reason and "sandforge image build" in reason
            with pytest.raises(SandboxUnavailable, match="stale"):
                backend.spawn(Limits())
        finally:
            backend.close()
    finally:
        docker_env.api.remove_image(f"{repo}:000000000000")


@pytest.mark.docker
def test_unknown_runtime_is_not_retriable(docker_env: DockerEnv) -> None:
    backend = DockerBackend(SandboxConfig(), runtime="no-such-runtime")
    try:
        with pytest.raises(SandboxUnavailable, match="no-such-runtime") as info:
            backend.spawn(Limits())
        assert not info.value.retriable
    finally:
        backend.close()


# --- pools ---------------------------------------------------------------------------------------


@pytest.mark.docker
def test_pool_member_replaced_when_its_container_dies(docker_env: DockerEnv) -> None:
    with Sandbox(SandboxConfig(backend="docker", pool_size=1)) as sb:
        pool = sb.pool()
        assert pool.wait_ready(1, timeout=60), pool.last_error
        with pool._lock:
            victim = pool._ready[0]
        assert isinstance(victim, ContainerWorker)
        docker_env.api.kill(victim.id)  # dies from outside while waiting in the pool
        docker_env.api.wait(victim.id, timeout=30)
        deadline = time.monotonic() + 10
        while victim.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not victim.alive()
        out = sb.execute(ExecutionRequest(code="return 'fresh'"))
        assert out.ok and out.value == "fresh", out.error_message
        assert out.metadata["container_id"] != victim.id[:12]
        assert pool.stats["replaced"] >= 1


# --- gVisor ----------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.gvisor
def test_gvisor_really_runs_under_runsc(docker_env: DockerEnv) -> None:
    backend = DockerBackend(SandboxConfig(), runtime="runsc")
    labels = {LABEL: "1", OWNER_LABEL: backend.owner}
    try:
        worker = backend.spawn(Limits())
        try:
            assert docker_env.api.inspect_container(worker.id)["HostConfig"]["Runtime"] == "runsc"
            assert worker.protections["gvisor"]
        finally:
            worker.destroy()
    finally:
        backend.close()
    # The kernel a container sees: the host's under runc, gVisor's own (Sentry) under runsc.
    probe = ["python3", "-I", "-S", "-c", "import os; print(os.uname().release)"]
    seen = {}
    for runtime in ("runc", "runsc"):
        cid = docker_env.api.create_container(
            docker_env.tag, command=probe, labels=labels, host_config=docker_env.api.create_host_config(
                network_mode="none", runtime=runtime)
        )["Id"]  # fmt: skip
        try:
            docker_env.api.start(cid)
            docker_env.api.wait(cid, timeout=60)
            seen[runtime] = docker_env.api.logs(cid).decode().strip()
        finally:
            docker_env.api.remove_container(cid, force=True)
    assert seen["runc"] == platform.release()
    assert seen["runsc"] and seen["runsc"] != platform.release()
