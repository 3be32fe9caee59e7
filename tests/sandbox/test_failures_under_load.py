"""Failures under load say what they are (issue 39, item 6), each provoked for real.

A worker killed while it starts is ``sandbox_unavailable`` (retriable) and replaced once before the caller
sees anything; a sandbox killed by a signal it cannot send itself (the OOM killer, the runtime, an operator)
is never the program's ``execution`` error; a zygote evicted while its children run takes them with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends import subprocess_backend
from sandforge.sandbox.backends.docker_backend import ContainerWorker, DockerBackend
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend, SubprocessWorker
from sandforge.sandbox.zygote import Zygote

SPIN = "while True:\n    pass"
LONG = Limits(timeout_s=60, cpu_s=120)
BACKENDS = ["subprocess", pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor])]


def kill_starts(monkeypatch: pytest.MonkeyPatch, backend: str, times: int) -> list[str]:
    """The next ``times`` workers started on ``backend`` are killed with SIGKILL while they start: a zygote's
    child right after its fork (before its lock-down), a container right after the runtime started it (before
    its runner reads the boot frame). Returns what was killed."""
    killed: list[str] = []
    if backend == "subprocess":
        spawn = Zygote.spawn

        def killing_spawn(self: Zygote, *args: Any, **kwargs: Any) -> int:
            pid = spawn(self, *args, **kwargs)
            if len(killed) < times:
                pidfd = os.pidfd_open(pid)
                os.kill(pid, signal.SIGKILL)  # its own process group may not exist yet (setsid comes first)
                # Dead before the host looks at it: a SIGKILL the runner has not had a core to act on yet (under
                # load) leaves a live, walled, ready process, which the host rightly hands out.
                select.select([pidfd], [], [], 30.0)
                os.close(pidfd)
                killed.append(str(pid))
            return pid

        monkeypatch.setattr(Zygote, "spawn", killing_spawn)
    else:
        boot_frame = ContainerWorker.boot_frame

        def killing_boot_frame(self: ContainerWorker, limits: Limits) -> Any:
            if len(killed) < times:
                self._owner.quick_api().kill(self.id)  # the runtime ends it, as under memory pressure
                killed.append(self.id)
            return boot_frame(self, limits)

        monkeypatch.setattr(ContainerWorker, "boot_frame", killing_boot_frame)
    return killed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_killed_while_starting_is_replaced_once_unseen(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    killed = kill_starts(monkeypatch, backend, times=1)
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:  # type: ignore[arg-type]
        outcome = sb.execute(ExecutionRequest(code="return 6 * 7"))
    assert len(killed) == 1
    assert outcome.ok and outcome.value == 42, outcome.error_message
    assert "failed to start" in outcome.metadata["sandbox_retried"], outcome.metadata


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_killed_while_starting_twice_is_sandbox_unavailable_and_retriable(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    killed = kill_starts(monkeypatch, backend, times=2)
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:  # type: ignore[arg-type]
        outcome = sb.execute(ExecutionRequest(code="return 1"))
        assert len(killed) == 2  # retried once, not more
        assert outcome.error_type == ErrorType.SANDBOX_UNAVAILABLE and outcome.retriable, outcome
        assert sb.execute(ExecutionRequest(code="return 2")).value == 2  # the next one starts clean


def test_a_worker_that_dies_after_its_ready_report_is_a_start_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between its ready report and the host's check of its walls (under load, the OOM killer), a worker
    shows no walls: that is a start that failed (retried once, unseen), not a machine without protections."""
    check = subprocess_backend.verify_protections
    killed: list[int] = []

    def killed_first(pid: int, *args: Any, **kwargs: Any) -> dict[str, bool]:
        if not killed:
            pidfd = os.pidfd_open(pid)
            os.kill(pid, signal.SIGKILL)
            select.select([pidfd], [], [], 30.0)  # dead (a zombie) before its walls are read
            os.close(pidfd)
            killed.append(pid)
        return check(pid, *args, **kwargs)

    monkeypatch.setattr(subprocess_backend, "verify_protections", killed_first)
    with Sandbox(SandboxConfig(pool_size=0)) as sb:
        outcome = sb.execute(ExecutionRequest(code="return 6 * 7"))
    assert len(killed) == 1
    assert outcome.ok and outcome.value == 42, outcome.error_message
    assert "died while its walls were checked" in outcome.metadata["sandbox_retried"], outcome.metadata


def run_aside(execute: Callable[[], ExecutionOutcome]) -> tuple[threading.Thread, list[ExecutionOutcome]]:
    got: list[ExecutionOutcome] = []
    thread = threading.Thread(target=lambda: got.append(execute()), daemon=True)
    thread.start()
    return thread, got


def spinning(pid: int, timeout_s: float = 60.0) -> psutil.Process:
    """The process under ``pid`` (or it) that runs the program, once it has burnt CPU."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            try:
                if proc.cpu_times().user > 0.3:
                    return proc
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise AssertionError("the program did not start")


def ended(proc: psutil.Process, timeout_s: float = 60.0) -> None:
    """Wait until ``proc`` has ended (a zombie its parent has not reaped counts: it runs no more)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"{proc} did not end")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sandbox_killed_from_outside_is_not_the_programs_error(backend: str) -> None:
    if backend == "subprocess":
        owner: Any = SubprocessBackend(SandboxConfig(pool_size=0))
    else:
        owner = DockerBackend(SandboxConfig(pool_size=0), runtime="runsc")
    try:
        worker = owner.spawn(LONG)
        thread, got = run_aside(lambda: worker.execute(ExecutionRequest(code=SPIN, limits=LONG), None))
        if backend == "subprocess":
            os.kill(spinning(worker.pid).pid, signal.SIGKILL)  # the program's process, as the OOM killer picks it
        else:
            time.sleep(1.5)  # the program runs in gVisor's own kernel: let it start
            owner.quick_api().kill(worker.id)  # the runtime kills the sandbox
        thread.join(timeout=60)
        [outcome] = got
    finally:
        owner.close()
    assert outcome.error_type == ErrorType.SANDBOX_UNAVAILABLE and outcome.retriable, outcome
    assert "signal 9" in (outcome.error_message or "") and outcome.metadata["signal"] == 9


def test_a_cpu_limit_kill_is_a_timeout_not_an_outside_kill() -> None:
    """RLIMIT_CPU (soft = hard) ends a program with SIGKILL too: the host-measured CPU time says it was the
    program's own use, so it is the CPU limit's ``timeout``."""
    with Sandbox(SandboxConfig(pool_size=0)) as sb:
        outcome = sb.execute(ExecutionRequest(code=SPIN, limits=Limits(timeout_s=30, cpu_s=1)))
    assert outcome.error_type == ErrorType.TIMEOUT, (outcome.error_message, outcome.usage, outcome.metadata)
    assert "CPU time limit" in (outcome.error_message or "")


def test_a_cpu_limit_kill_whose_runner_exits_late_is_still_a_timeout() -> None:
    """Under load a runner's pid-1 mirror (the process that reaps the program and passes its status on: a
    runner started without a zygote, or one whose kernel refuses to clone it pid 1) may run late after the
    program's CPU-limit kill. Stopped for longer than the host used to wait, it must still be waited for:
    killed before it reaps the program, the program's CPU time would be lost from the host's account and the
    kill read as an outside one (``sandbox_unavailable``)."""
    backend = SubprocessBackend(SandboxConfig(pool_size=0, zygote=False))
    try:
        worker = backend.spawn(Limits(timeout_s=30, cpu_s=1))
        mirror = psutil.Process(worker.pid)
        if not mirror.children(recursive=True):
            pytest.skip("the runner is its program's own process here (no pid-1 mirror to run late)")
        thread, got = run_aside(lambda: worker.execute(ExecutionRequest(code=SPIN, limits=worker.limits), None))
        program = spinning(worker.pid)
        assert program.pid != mirror.pid
        mirror.suspend()
        ended(program)  # the CPU limit's kill; the stopped mirror cannot reap it yet
        time.sleep(1.5)  # longer than the host's old one-second grace
        with contextlib.suppress(psutil.NoSuchProcess):  # the host may have killed it meanwhile
            mirror.resume()
        thread.join(timeout=60)
        [outcome] = got
    finally:
        backend.close()
    assert outcome.error_type == ErrorType.TIMEOUT, (outcome.error_message, outcome.usage, outcome.metadata)
    assert "CPU time limit" in (outcome.error_message or "")


def test_an_evicted_zygote_takes_its_running_children_with_it() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0))
    try:
        worker: SubprocessWorker = backend.spawn(LONG)
        zygote = backend._zygotes[LONG]
        thread, got = run_aside(lambda: worker.execute(ExecutionRequest(code=SPIN, limits=LONG), None))
        program = spinning(worker.pid)
        tree = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
        assert program in tree
        for seconds in range(1, SubprocessBackend.MAX_ZYGOTES + 1):  # as many other limits: the oldest goes
            backend.spawn(Limits(timeout_s=seconds)).destroy()
        assert zygote not in backend._zygotes.values() and not zygote.alive()
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert not alive, f"the evicted zygote's children still run: {alive}"
        thread.join(timeout=30)
        [outcome] = got
    finally:
        backend.close()
    assert outcome.error_type == ErrorType.SANDBOX_UNAVAILABLE and outcome.retriable, outcome


LARGE_HOST = """
import json
from sandforge.sandbox import ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend

ballast = b"x" * (400 << 20)  # this process's peak resident size: 400 MB and more, past the runners' limit
del ballast
backend = SubprocessBackend(SandboxConfig(pool_size=0, zygote=False))
try:
    limits = Limits(timeout_s=30, cpu_s=1, memory_mb=256)
    seen = []
    for code in ("return 1", "while True:\\n    pass"):
        out = backend.spawn(limits).execute(ExecutionRequest(code=code, limits=limits), None)
        seen.append([out.error_type, out.error_message, out.usage.peak_memory_mb])
finally:
    backend.close()
print(json.dumps(seen))
"""


def test_a_runner_exec_d_by_a_large_host_is_not_charged_the_hosts_memory() -> None:
    """A runner started without a zygote is exec'd by the host, and the kernel hands an exec'd image its
    parent's peak resident size: reaped, it reads as using the host's memory. From a host past the runner's
    memory limit, a trivial program must not report that peak, nor a CPU-limit kill read as a memory kill."""
    got = subprocess.run([sys.executable, "-c", LARGE_HOST], capture_output=True, text=True, timeout=120, check=True)
    (ok_type, _, ok_peak), (spin_type, spin_message, _) = json.loads(got.stdout)
    assert ok_type is None and ok_peak < 256, got.stdout
    assert spin_type == ErrorType.TIMEOUT and "CPU time limit" in spin_message, got.stdout
