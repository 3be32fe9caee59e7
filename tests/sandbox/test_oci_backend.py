"""The runc and runsc backends: OCI runtimes driven directly, without dockerd.

The shared contract, isolation and attack tests run on these backends through the ``sandbox_backend`` and
``escaped_backend`` fixtures; this file covers what is specific to driving a runtime: the spec we hand it,
what the host verifies, container ids, and that nothing is left behind (bundles, runtime state, orphans
of a process that died).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import (
    ErrorType,
    ExecutionRequest,
    Limits,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    handoff,
    oci_spec,
)
from sandforge.sandbox.backends import oci_backend
from sandforge.sandbox.backends.oci_backend import OciBackend
from sandforge.sandbox.ownership import process_tag
from sandforge.sandbox.protections import CONTAINER_PROTECTIONS
from sandforge.sandbox.seccomp import DENIED_SYSCALLS

#: These tests list what this process leaves on the host: no shared Sandbox's warm worker may show there.
pytestmark = pytest.mark.usefixtures("without_shared_sandboxes")

LIMITS = Limits(timeout_s=5, memory_mb=96, disk_mb=4, max_processes=8, cpus=0.5)
RUNTIMES = [pytest.param("runc", marks=pytest.mark.oci("runc")), pytest.param("runsc", marks=pytest.mark.oci("runsc"))]


@pytest.fixture(params=RUNTIMES)
def backend(request: pytest.FixtureRequest) -> Iterator[OciBackend]:
    be = OciBackend(SandboxConfig(pool_size=0), runtime=request.param)
    try:
        yield be
    finally:
        be.close()


def ours(backend: OciBackend) -> list[str]:
    """Container ids of this process known to the runtime, bundles and containers' hand-off directories still
    on disk."""
    listed = subprocess.run([*backend.command(), "list", "--quiet"], capture_output=True, text=True, check=False)
    prefix = f"{oci_backend.ID_PREFIX}-{process_tag()}-"
    bundles = [p.name for p in backend.bundles.iterdir()] if backend.bundles.exists() else []
    handed = [p.name for p in handoff.base_dir().glob(f"{handoff.PREFIX}{process_tag()}-*") if (p / "in").exists()]
    return [i for i in [*listed.stdout.split(), *bundles] if i.startswith(prefix)] + handed


def wait_clean(backend: OciBackend, timeout: float = 20.0) -> list[str]:
    oci_backend._REAPER.drain(timeout)
    deadline = time.monotonic() + timeout
    while (left := ours(backend)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --- the spec ----------------------------------------------------------------------------------------------


def test_spec_states_every_wall(tmp_path: Path) -> None:
    spec = oci_spec.container_spec(
        rootfs=tmp_path, args=["/usr/bin/python3"], limits=LIMITS, uid=65534, gid=65534, cgroups_path=None
    )
    process, linux = spec["process"], spec["linux"]
    assert spec["root"] == {"path": str(tmp_path), "readonly": True}
    assert process["noNewPrivileges"] is True and process["env"] == []
    assert process["user"]["uid"] == 65534 and process["user"]["gid"] == 65534
    assert all(caps == [] for caps in process["capabilities"].values())
    assert {ns["type"] for ns in linux["namespaces"]} >= {"pid", "network", "ipc", "uts", "mount"}
    assert all("path" not in ns for ns in linux["namespaces"])  # new namespaces, never joined ones
    memory = LIMITS.memory_mb * 1024 * 1024
    assert linux["resources"]["memory"] == {"limit": memory, "swap": memory}
    assert linux["resources"]["pids"] == {"limit": LIMITS.max_processes}
    assert linux["resources"]["cpu"]["quota"] == int(LIMITS.cpus * oci_spec.CPU_PERIOD_US)
    tmp = next(m for m in spec["mounts"] if m["destination"] == oci_spec.SCRATCH)
    assert {"noexec", "nosuid", "nodev", f"size={LIMITS.disk_mb}m"} <= set(tmp["options"])
    assert not any(m["type"] == "bind" for m in spec["mounts"])  # no host path inside
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]


def test_spec_seccomp_is_the_runner_deny_list_minus_exec() -> None:
    profile = oci_spec.seccomp_profile()
    denied = {name for rule in profile["syscalls"] for name in rule["names"]}
    assert denied == (set(DENIED_SYSCALLS) | {"clone3"}) - oci_spec.RUNTIME_NEEDS
    assert {"socket", "connect", "ptrace", "mount", "unshare", "bpf"} <= denied
    eperm = next(r for r in profile["syscalls"] if "socket" in r["names"])
    assert eperm["action"] == "SCMP_ACT_ERRNO" and eperm["errnoRet"] == errno.EPERM


# --- what the host verifies --------------------------------------------------------------------------------


def test_every_protection_is_verified(backend: OciBackend) -> None:
    worker = backend.spawn(LIMITS)
    try:
        missing = [p for p in CONTAINER_PROTECTIONS if not worker.protections.get(p)]
        assert not missing, f"not verified on {backend.name}: {missing}"
        assert worker.protections.get("gvisor", False) == (backend.runtime == "runsc")
    finally:
        worker.destroy()


@pytest.mark.oci("runc")
def test_runc_protections_come_from_the_container_process() -> None:
    """With runc the host reads the container's own process: its cgroup limits are the ones we asked for."""
    backend = OciBackend(SandboxConfig(pool_size=0), runtime="runc")
    worker = backend.spawn(LIMITS)
    try:
        pid = worker._container_pid()
        assert pid is not None
        seen = oci_backend.host_view(
            pid, LIMITS, memory_bytes=LIMITS.memory_mb * 1024 * 1024, pids=LIMITS.max_processes
        )
        assert all(seen.values()), seen
        # a limit other than the one requested is not reported as verified
        wrong = oci_backend.host_view(pid, LIMITS, memory_bytes=1024 * 1024 * 1024, pids=LIMITS.max_processes + 1)
        assert not wrong["memory_limit"] and not wrong["pids_limit"]
    finally:
        worker.destroy()
        backend.close()


def test_a_required_protection_it_cannot_verify_refuses_the_worker(backend: OciBackend) -> None:
    config = SandboxConfig(pool_size=0, required_protections=("seccomp", "gvisor"))
    strict = OciBackend(config, runtime=backend.runtime)  # type: ignore[arg-type]
    try:
        if backend.runtime == "runsc":
            strict.spawn(LIMITS).destroy()  # runsc is gVisor: satisfied
        else:
            with pytest.raises(SandboxUnavailable, match="gvisor"):
                strict.spawn(LIMITS)
    finally:
        strict.close()
    assert not wait_clean(backend)


# --- lifecycle: ids, cleanup, orphans ---------------------------------------------------------------------


def test_container_ids_are_unique_across_backends_of_one_process() -> None:
    a = OciBackend(SandboxConfig(), runtime="runc")
    b = OciBackend(SandboxConfig(), runtime="runc")
    ids = {a.new_id() for _ in range(50)} | {b.new_id() for _ in range(50)}
    assert len(ids) == 100
    assert all(oci_backend._owner_alive(i) for i in ids)
    assert not oci_backend._owner_alive("sf-999999999-1-0")  # no such process
    assert oci_backend._owner_alive("someone-elses-container")  # not ours: never touched


def test_nothing_is_left_behind(backend: OciBackend) -> None:
    """Successes, failures, timeouts and crashes: every container and bundle is gone afterwards."""
    programs = [
        ("return 1", None),
        ("raise ValueError('x')", ErrorType.EXECUTION),
        ("while True:\n    pass", ErrorType.TIMEOUT),
        ("x = 'a' * (10 ** 9)\nreturn 1", ErrorType.MEMORY_LIMIT),
    ]
    limits = LIMITS.model_copy(update={"timeout_s": 1.5})
    for code, expected in programs:
        worker = backend.spawn(limits)
        out = worker.execute(ExecutionRequest(code=code, limits=limits), None)
        assert (out.error_type if not out.ok else None) == expected, out.error_message
    unused = backend.spawn(limits)  # never used: destroyed by a closing pool
    unused.destroy()
    assert not wait_clean(backend)


def test_orphans_of_a_dead_process_are_removed(backend: OciBackend, tmp_path: Path) -> None:
    """A container whose owner died (its id names a process that no longer exists) is force-deleted, and its
    bundle removed, when a backend of that runtime starts."""
    orphan = f"sf-999999999-1-{backend.runtime}"
    bundle = backend.bundles / orphan
    backend.bundles.mkdir(parents=True, exist_ok=True)
    backend.state.mkdir(parents=True, exist_ok=True)
    bundle.mkdir(exist_ok=True)
    backend.force_delete(orphan)  # a leftover of an interrupted run of this test
    gvisor = backend.runtime == "runsc"
    spec = oci_spec.container_spec(
        rootfs=backend.rootfs,
        args=["/usr/bin/python3", "-c", "import time; time.sleep(120)"],
        limits=LIMITS,
        uid=65534,
        gid=65534,
        cgroups_path=None,
        pids_headroom=oci_backend.GVISOR_PIDS_HEADROOM if gvisor else 0,
        memory_headroom_mb=oci_backend.GVISOR_MEMORY_HEADROOM_MB if gvisor else 0,
    )
    run = [*backend.command(), "run", "--detach", "--bundle", str(bundle), orphan]
    # (all stdio to /dev/null: a detached container keeps whatever it inherits open)
    null = subprocess.DEVNULL
    for attempt in range(5):  # any backend starting in another test process may reap the bundle mid-setup
        bundle.mkdir(exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(spec))
        try:
            subprocess.run(run, stdin=null, stdout=null, stderr=null, check=True, timeout=60)
            break
        except subprocess.CalledProcessError:
            backend.force_delete(orphan)
            if attempt == 4:
                raise

    def listed() -> list[str]:
        out = subprocess.run([*backend.command(), "list", "--quiet"], capture_output=True, text=True, check=False)
        return out.stdout.split()

    # (another test process starting a backend at this moment may reap it first: the same code, same result)
    fresh = OciBackend(SandboxConfig(pool_size=0), runtime=backend.runtime)  # type: ignore[arg-type]
    try:
        fresh.spawn(LIMITS).destroy()  # starting the backend reaps in the background
        deadline = time.monotonic() + 30
        while (orphan in listed() or bundle.exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert orphan not in listed(), f"orphan container still listed: {listed()}"
        assert not bundle.exists(), f"orphan bundle still there: {sorted(p.name for p in bundle.iterdir())}"
    finally:
        fresh.close()


# --- availability ------------------------------------------------------------------------------------------


def test_a_missing_rootfs_is_a_typed_unavailable_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_CACHE_DIR", str(tmp_path))  # no unpacked image in an empty cache
    config = SandboxConfig(backend="runc", pool_size=0)
    reason = OciBackend(config, runtime="runc").unavailable_reason()
    if os.geteuid() != 0:
        assert reason is not None and "root" in reason
        return
    assert reason is not None and "sandforge image build" in reason
    with Sandbox(config) as sb:
        out = sb.execute(ExecutionRequest(code="return 1"))
    assert out.error_type == ErrorType.SANDBOX_UNAVAILABLE and "image build" in (out.error_message or "")


def test_the_pool_serves_never_reused_containers(backend: OciBackend) -> None:
    with Sandbox(SandboxConfig(backend=backend.runtime, pool_size=2)) as sb:  # type: ignore[arg-type]
        outs = [sb.execute(ExecutionRequest(code="return 1")) for _ in range(4)]
        ids = {o.metadata["container_id"] for o in outs}
    assert all(o.ok for o in outs), [o.error_message for o in outs]
    assert len(ids) == 4  # a fresh container each time
    assert not wait_clean(backend)


@pytest.mark.oci("runc")
def test_image_status_reports_the_unpacked_rootfs(docker_env: Any) -> None:
    from sandforge.sandbox import image

    st = image.status(docker_env.api)
    assert st.oci_rootfs_present and Path(st.oci_rootfs) == image.oci_rootfs(st.expected)
    assert image.export_rootfs(docker_env.api, st.expected, lambda _msg: None) is False  # idempotent: no re-export
