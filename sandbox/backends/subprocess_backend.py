"""The `subprocess` backend: one never-reused, locked-down Python process per execution.

The runner locks itself down after boot (see ``sandbox/runner.py``); this module starts it with no
environment and no inherited descriptors, then verifies from the outside, through ``/proc``, which
protections are really in force, and refuses workers that lack one the configuration requires.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import RestrictedPython

from sandbox import seccomp
from sandbox.backends.base import SandboxUnavailable
from sandbox.config import SUBPROCESS_PROTECTIONS, SandboxConfig
from sandbox.exchange import BridgeHandler, ExitInfo, Stream, await_ready, build_outcome, run_exchange
from sandbox.protocol import (
    BootFrame,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    ProtocolError,
    ResourceUsage,
    encode_frame,
)

log = logging.getLogger(__name__)

RUNNER = Path(__file__).resolve().parent.parent / "runner.py"


class PipeIO:
    """WorkerIO over the child's stdin (frames in), fd 3 (frames out), stdout and stderr."""

    def __init__(self, stdin_fd: int, streams: dict[int, Stream]) -> None:
        self.stdin_fd = stdin_fd
        self.selector = selectors.DefaultSelector()
        for fd, name in streams.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, name)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.stdin_fd, view)
            except InterruptedError:
                continue
            view = view[written:]

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        chunks: list[tuple[Stream, bytes]] = []
        for key, _ in self.selector.select(timeout):
            fd = key.fd
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(fd)
            chunks.append((key.data, chunk))
        return chunks

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()


class SubprocessWorker:
    backend = "subprocess"

    def __init__(self, config: SandboxConfig, limits: Limits, runner: Path = RUNNER) -> None:
        self.limits = limits
        self.created_at = time.monotonic()
        self.protections: dict[str, bool] = {}
        self._workdir = Path(tempfile.mkdtemp(prefix="sandforge-"))
        self._destroyed = False
        root = os.geteuid() == 0
        if root:
            os.chown(self._workdir, config.sandbox_uid, config.sandbox_gid)
        python = config.python or sys.executable
        stdin_r, stdin_w = os.pipe()
        result_r, result_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-B", str(runner), "--result-fd", str(result_w)],
                stdin=stdin_r,
                stdout=out_w,
                stderr=err_w,
                env={},
                cwd=self._workdir,
                close_fds=True,
                pass_fds=(result_w,),
                start_new_session=True,
            )
        except OSError as exc:
            for fd in (stdin_w, result_r, out_r, err_r):
                os.close(fd)
            self._cleanup_dir()
            raise SandboxUnavailable(f"cannot start the sandbox interpreter {python}: {exc}", retriable=False) from exc
        finally:
            for fd in (stdin_r, result_w, out_w, err_w):
                os.close(fd)
        self._stdin, self._read_fds = stdin_w, (result_r, out_r, err_r)
        self.io = PipeIO(stdin_w, {result_r: "result", out_r: "stdout", err_r: "stderr"})
        boot = BootFrame(
            sys_path=[str(Path(RestrictedPython.__file__).resolve().parent.parent)],
            limits=limits,
            seccomp_bpf_b64=_b64(seccomp.compiled_filter()),
            namespaces=True,
            chroot=True,
            workdir=str(self._workdir),
            drop_to_uid=config.sandbox_uid if root else None,
            drop_to_gid=config.sandbox_gid if root else None,
        )
        try:
            self.io.send(encode_frame(boot, 1 << 20))
            ready = await_ready(self.io, limits, config.spawn_timeout_s)
        except (ProtocolError, OSError) as exc:
            self.destroy()
            raise SandboxUnavailable(f"sandbox worker failed to start: {exc}") from exc
        self.protections = verify_protections(self.proc.pid, ready.protections)
        missing = [p for p in config.required_protections if not self.protections.get(p)]
        if missing:
            self.destroy()
            detail = "; ".join(ready.errors) or "not reported active"
            raise SandboxUnavailable(
                f"required protections not active on this machine: {', '.join(missing)} ({detail})",
                retriable=False,
            )

    def alive(self) -> bool:
        return not self._destroyed and self.proc.poll() is None

    def execute(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        try:
            if not self.alive():
                return ExecutionOutcome.failure(ErrorType.SANDBOX_UNAVAILABLE, "sandbox worker died before use")
            ex = run_exchange(self.io, request, bridge)
            if ex.failure is not None:
                self._kill()
            exit_info = self._reap(grace_s=1.0)
            return build_outcome(ex, exit_info, backend=self.backend, protections=self.protections, limits=self.limits)
        finally:
            self.destroy()

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _reap(self, grace_s: float) -> ExitInfo:
        """wait4 the runner: exit status plus host-measured CPU time and peak memory of it and its child."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return ExitInfo()
            if pid:
                break
            if time.monotonic() > deadline:
                self._kill()
                deadline = float("inf")
            time.sleep(0.0005)
        self.proc.returncode = status
        code = os.waitstatus_to_exitcode(status)
        sig = -code if code < 0 else (code - 128 if code > 128 else None)
        usage = ResourceUsage(
            cpu_time_s=round(rusage.ru_utime + rusage.ru_stime, 6),
            peak_memory_mb=round(rusage.ru_maxrss / 1024, 3),
            source="host",
        )
        return ExitInfo(exit_code=code if code >= 0 else None, signal=sig, usage=usage)

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._kill()
        with contextlib.suppress(ChildProcessError, OSError):
            if self.proc.returncode is None:
                os.waitpid(self.proc.pid, 0)
                self.proc.returncode = -9
        self.io.close()
        for fd in (self._stdin, *self._read_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)


def _b64(data: bytes | None) -> str | None:
    import base64

    return base64.b64encode(data).decode() if data else None


def _proc_status(pid: int) -> dict[str, str]:
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _ns(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _worker_pid(pid: int) -> int:
    """The process that runs the program: the runner itself, or its pid-namespace child."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            children = [int(c) for c in fh.read().split()]
    except OSError:
        children = []
    return children[0] if children else pid


def verify_protections(pid: int, claimed: dict[str, bool]) -> dict[str, bool]:
    """Check from outside what the runner claims; a claim the host cannot confirm counts as absent."""
    wpid = _worker_pid(pid)
    status = _proc_status(wpid)
    verified: dict[str, bool] = {p: False for p in SUBPROCESS_PROTECTIONS}
    verified["seccomp"] = claimed.get("seccomp", False) and status.get("Seccomp") == "2"
    verified["no_new_privs"] = claimed.get("no_new_privs", False) and status.get("NoNewPrivs") == "1"
    uids = status.get("Uid", "0").split()
    verified["unprivileged_user"] = bool(uids) and all(u != "0" for u in uids) or (
        claimed.get("user_namespace", False) and _ns(wpid, "user") != _ns("self", "user")
    )
    for kind in ("net", "mnt", "ipc", "uts", "pid"):
        name = {"mnt": "mount"}.get(kind, kind) + "_namespace"
        theirs, ours = _ns(wpid, kind), _ns("self", kind)
        verified[name] = claimed.get(name, False) and theirs is not None and theirs != ours
    try:
        verified["private_root"] = claimed.get("private_root", False) and os.readlink(f"/proc/{wpid}/root") != "/"
    except OSError:
        verified["private_root"] = False
    verified["rlimits"] = claimed.get("rlimits", False) and _rlimits_set(wpid)
    if "user_namespace" in claimed:
        verified["user_namespace"] = _ns(wpid, "user") != _ns("self", "user")
    return verified


def _rlimits_set(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/limits") as fh:
            text = fh.read()
    except OSError:
        return False
    limits = {line[:26].strip(): line[26:].split() for line in text.splitlines()[1:]}
    needed = ("Max cpu time", "Max address space", "Max file size", "Max open files", "Max processes")
    return all(name in limits and limits[name][0] != "unlimited" for name in needed) and limits.get(
        "Max core file size", ["1"]
    )[0] == "0"


class SubprocessBackend:
    name = "subprocess"

    def __init__(self, config: SandboxConfig, *, runner: Path = RUNNER) -> None:
        self.config = config
        self.runner = runner

    def spawn(self, limits: Limits) -> SubprocessWorker:
        return SubprocessWorker(self.config, limits, self.runner)

    def close(self) -> None:
        pass

