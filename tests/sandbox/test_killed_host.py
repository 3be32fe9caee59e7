"""Nothing outlives a host killed with SIGKILL (issue 13, item 9).

A host process starts a sandbox running an endless program and is killed; its sandbox processes must die
(the zygote kills its children when the host hangs up, the pid-namespace parent kills its child, the
runner's own wall-clock backstop ends the rest), and what it left on disk or in an engine must be reaped:
by the next backend that starts and by ``sandforge cleanup --apply``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sandforge.sandbox import leftovers

REPO = Path(__file__).resolve().parents[2]
ENDLESS = "x = 0\nwhile True:\n    x += 1"

HOST = """
import json, sys
from sandforge.sandbox import ExecutionRequest, Limits, SandboxConfig
backend_name, zygote = sys.argv[1], sys.argv[2] == "1"
limits = Limits(timeout_s=60, cpu_s=120)
if backend_name == "subprocess":
    from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
    backend = SubprocessBackend(SandboxConfig(pool_size=0, zygote=zygote))
else:
    from sandforge.sandbox.backends.docker_backend import DockerBackend
    backend = DockerBackend(SandboxConfig(pool_size=0), runtime="runsc" if backend_name == "gvisor" else None)
worker = backend.spawn(limits)
info = {"pid": getattr(worker, "pid", None), "workdir": str(getattr(worker, "_workdir", "")),
        "container": getattr(worker, "id", None), "zygote": getattr(getattr(worker, "_zygote", None), "proc", None)}
info["zygote"] = info["zygote"].pid if info["zygote"] is not None else None
print(json.dumps(info), flush=True)
worker.execute(ExecutionRequest(code=ENDLESS, limits=limits), None)
""".replace("ENDLESS", repr(ENDLESS))


def start_host(
    backend: str, zygote: bool, tmpdir: Path | None = None
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST, backend, "1" if zygote else "0"],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the host did not start its sandbox"
    return proc, json.loads(line)


def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def cleanup(tmpdir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``sandforge cleanup`` in a process of its own that looks in ``tmpdir``. Not in this one with its
    ``tempfile.tempdir`` changed: a look for leftovers this worker's backends started on a timer (a few
    seconds after a start) would look there too, and reap the killed host's workdir before the test asks."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmpdir)}
    command = [sys.executable, "-m", "sandforge", "cleanup", *flags]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=60, check=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "fresh-interpreter"])
def test_a_killed_hosts_subprocess_sandbox_dies_and_its_workdir_is_reaped(zygote: bool) -> None:
    # A temporary directory of the test's own: a backend starting in another test worker reaps dead
    # owners' leftovers in the shared one and could remove this workdir before ``cleanup`` is asked.
    own_tmp = Path(tempfile.mkdtemp(prefix="killed-host-"))
    own_tmp.chmod(0o755)
    host, info = start_host("subprocess", zygote, own_tmp)
    pid = int(str(info["pid"]))
    # From a zygote the runner is born pid 1 of its namespace (one process); started directly it forks its pid-1 child
    assert wait_for(lambda: len(tree(pid)) >= (1 if zygote else 2)), "the program did not start"
    sandbox = tree(pid) + ([psutil.Process(int(str(info["zygote"])))] if info["zygote"] else [])
    host.send_signal(signal.SIGKILL)
    host.wait()
    assert wait_for(lambda: not alive(sandbox)), f"outlived the host: {[p.pid for p in alive(sandbox)]}"
    workdir = Path(str(info["workdir"]))
    assert workdir.name.startswith(leftovers.WORKDIR_PREFIX) and workdir.exists()
    result = cleanup(own_tmp, "--json", "--no-containers")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)["leftovers"]
    assert {"kind": "workdir", "name": workdir.name} in [{"kind": i["kind"], "name": i["name"]} for i in listed]
    assert workdir.exists(), "a dry run removed something"
    result = cleanup(own_tmp, "--apply", "--no-containers")
    assert result.returncode == 0, result.stderr
    assert not workdir.exists() and f"removed: workdir {workdir.name}" in result.stdout
    own_tmp.rmdir()


def test_a_live_hosts_files_are_not_leftovers(tmp_path: Path) -> None:
    mine = leftovers.new_workdir()
    try:
        found, _ = leftovers.find(containers=False)
        assert mine.name not in [item.name for item in found]
    finally:
        mine.rmdir()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend",
    [pytest.param("docker", marks=pytest.mark.docker),
     pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor])],
)  # fmt: skip
def test_a_killed_hosts_container_is_reaped_by_the_next_start(backend: str, docker_env: object) -> None:
    from sandforge.sandbox.containers import LABEL
    from sandforge.sandbox.docker_engine import connect

    host, info = start_host(backend, False)
    container = str(info["container"])
    time.sleep(0.5)
    host.send_signal(signal.SIGKILL)
    host.wait()
    api = connect()

    def ours() -> list[str]:
        return [c["Id"] for c in api.containers(all=True, filters={"label": f"{LABEL}=1"})]

    assert any(cid.startswith(container) for cid in ours()), "the container vanished by itself"
    leftovers.reap_in_background()  # what a starting backend does
    assert wait_for(lambda: not any(cid.startswith(container) for cid in ours()), 60), "the container outlived it"


@pytest.mark.timeout(60)
def test_the_runner_ends_itself_after_its_deadline_when_the_host_cannot(tmp_path: Path) -> None:
    """The wall-clock backstop: a host that is hung (here: one that only never kills) still gets its
    sandbox ended, by SIGALRM in the runner, shortly after the deadline."""
    from sandforge.sandbox.backends.subprocess_backend import RUNNER, boot_frame
    from sandforge.sandbox.config import SandboxConfig
    from sandforge.sandbox.protocol import Limits, encode_frame

    limits = Limits(timeout_s=1, cpu_s=60)
    boot = boot_frame(SandboxConfig(), limits, None)
    boot = boot.model_copy(update={"namespaces": False, "chroot": False, "drop_to_uid": None, "drop_to_gid": None})
    result_r, result_w = os.pipe()
    runner = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(RUNNER), "--result-fd", str(result_w)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(result_w,),
        cwd=tmp_path,
    )  # fmt: skip
    os.close(result_w)
    assert runner.stdin is not None
    execute = {"type": "execute", "code": ENDLESS, "args": [], "kwargs": {}, "context_keys": []}
    runner.stdin.write(encode_frame(boot, 1 << 20) + encode_frame(execute, 1 << 20))
    runner.stdin.flush()  # and keep stdin open: the host is "alive", it just never acts
    try:
        code = runner.wait(timeout=30)
    finally:
        runner.kill()
        os.close(result_r)
    assert code == -signal.SIGALRM
