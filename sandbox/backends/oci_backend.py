"""The `runc` and `runsc` backends: one disposable container per execution, with no daemon in the path.

The Docker backends spend most of a container's start-up in dockerd (API calls, image and network
bookkeeping), which caps their container rate (docs/benchmarks.md). These backends drive the OCI
runtime binary itself: each worker is ``runc run`` (or ``runsc run``, gVisor) of a per-container bundle
whose ``config.json`` comes from ``sandbox/oci_spec.py`` and whose root is the sandbox image's
filesystem, unpacked once by ``sandforge image build`` and shared read-only by every container. The
runtime runs in the foreground with our pipes as the container's stdio: stdin carries frames in (runsc;
with runc a unix socket passed as descriptor 3 does, see ``INPUT_FD``), stdout is the result channel (the
runner keeps it and points its own stdout at stderr before any program runs), and stderr carries the
runner's and the runtime's diagnostics.

After the ready frame, the host checks from ``/proc`` and the cgroup filesystem what is really in force
(runc: the container process itself; runsc: the gVisor sandbox process, plus the runner's own report from
inside the sentry). A worker that lacks a required protection is refused.

The runtime exits when the container's process does, with its exit status, once it has deleted the container
and its cgroup itself; it holds the result channel until then, so the channel's end and the status the host
judges the result with come together. The host removes the bundle directory off the hot path. Bundles of
processes that died are removed (and their containers force-deleted) when a backend starts. Both need
root: rootless containers are not supported by these backends.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import psutil

from sandforge.sandbox import boot, handoff, image, leftovers, oci_spec, protections, verify
from sandforge.sandbox.channel import PipeIO, SocketIO, Stream, socket_channel, widen_pipe
from sandforge.sandbox.cleanup import CleanupQueue
from sandforge.sandbox.config import SandboxConfig
from sandforge.sandbox.containers import COMMAND as CONTAINER_COMMAND
from sandforge.sandbox.containers import GVISOR_MEMORY_HEADROOM_MB, GVISOR_PIDS_HEADROOM, ID_PREFIX, PYTHON, SCRATCH
from sandforge.sandbox.environment import MountedEnvironment, require_mounted
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.exchange import (
    EXIT_GRACE_S,
    BridgeHandler,
    ExitInfo,
    await_ready,
    build_outcome,
    died_before_use,
    exchange_steps,
)
from sandforge.sandbox.inside.wire import MAX_BOOT_BYTES
from sandforge.sandbox.oci_runtime import RUNTIME_ENV, STATE_DIR, command_with, force_delete
from sandforge.sandbox.ownership import named_owner_alive, process_tag
from sandforge.sandbox.protections import Protection as P
from sandforge.sandbox.protocol import (
    BootFrame,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    ProtocolError,
    encode_frame,
)
from sandforge.sandbox.steps import Blocking, Steps, run_steps

log = logging.getLogger(__name__)

Runtime = Literal["runc", "runsc"]
#: The container's process: the runner, as in the Docker backends (the runtime wants an absolute path).
COMMAND = [PYTHON, *CONTAINER_COMMAND[1:]]
#: runc, run in the foreground, copies the container's stdio through pipes of its own, so nothing but bytes
#: can pass through them. Frames into a runc container travel instead over a unix socket the runtime hands
#: to the container as descriptor 3 (``--preserve-fds 1``), which can also pass sealed memfds of large
#: context values (see ``sandbox.exchange.send_execute``). The shell only moves the socket to descriptor 3
#: before it becomes the runtime (``exec``); the runtime's own stdin is /dev/null.
INPUT_FD = 3
_WITH_INPUT_FD = ["/bin/sh", "-c", f'exec "$@" {INPUT_FD}<&0 </dev/null', "sh"]


def _owner_alive(container_id: str) -> bool:
    return named_owner_alive(container_id, ID_PREFIX)


def _finish(
    proc: subprocess.Popen[bytes], bundle: Path, delete: Callable[[], None] | None, handed: handoff.HandoffDir | None
) -> None:
    """The runtime exits right after the container and deletes it; if it does not, kill it and delete the
    container ourselves. Then the bundle and the hand-off directory go."""
    try:
        proc.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        delete = delete or (lambda: None)
    if delete is not None:
        delete()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    shutil.rmtree(bundle, ignore_errors=True)
    if handed is not None:
        handed.remove()


_REAPER = CleanupQueue("sandforge-oci-reaper")
_IDS = itertools.count()  # shared by every backend of this process: container ids must be unique
_BACKENDS: weakref.WeakSet[OciBackend] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for backend in list(_BACKENDS):
        with contextlib.suppress(Exception):
            backend.close()
    _REAPER.drain(timeout=30.0)


# --- what the host can see -------------------------------------------------------------------------------


def host_view(pid: int, limits: Limits, *, memory_bytes: int, pids: int) -> dict[str, bool]:
    """The container protections as ``/proc`` and the cgroup filesystem show them for ``pid``."""
    status = verify.proc_status(pid)
    mounts = verify.mounts(pid)
    cg = verify.cgroup_limits(pid)
    root_opts = mounts.get("/", ("", ""))[1].split(",")
    tmp_type, tmp_opts = mounts.get(SCRATCH, ("", ""))
    namespaces = verify.separate_namespaces(pid)
    walls = verify.process_walls(pid, status)
    return {
        P.NETWORK_NONE: namespaces["net"] and verify.only_loopback(pid),
        P.READ_ONLY_ROOTFS: "ro" in root_opts,
        P.TMPFS_LIMITED: tmp_type == "tmpfs" and "noexec" in tmp_opts.split(",") and "size=" in tmp_opts,
        P.CAPABILITIES_DROPPED: verify.no_capabilities(status, ("Eff", "Bnd")),
        P.NO_NEW_PRIVS: walls[P.NO_NEW_PRIVS],
        P.UNPRIVILEGED_USER: walls[P.UNPRIVILEGED_USER],
        P.MEMORY_LIMIT: cg["memory"] == memory_bytes,
        P.NO_SWAP: cg["memory_swap"] in (None, memory_bytes) and cg["memory"] == memory_bytes,
        P.PIDS_LIMIT: cg["pids"] == pids,
        P.CPU_LIMIT: cg["cpu_quota"] is not None,
        P.SECCOMP: walls[P.SECCOMP],
        P.RLIMITS: walls[P.RLIMITS],
        P.PRIVATE_ROOT: namespaces["mnt"] and verify.other_root(pid),
        **{name: namespaces[kind] for kind, name in verify.NAMESPACES.items()},
    }


#: The walls the runner raises itself: under runsc the host sees only the sentry, so the runner's report of
#: them stands; under runc each must also show in ``/proc`` of the container's process.
RUNNER_WALLS = (P.SECCOMP, P.NO_NEW_PRIVS, P.RLIMITS, P.UNPRIVILEGED_USER)


# --- the worker ------------------------------------------------------------------------------------------


class OciWorker:
    """One container run by the OCI runtime in the foreground, locked down and waiting for one execution."""

    def __init__(self, backend: OciBackend, limits: Limits, environment: MountedEnvironment | None = None) -> None:
        self.backend = backend.name
        self.limits = limits
        self.environment = environment
        self.created_at = time.monotonic()
        self.protections: dict[str, bool] = {}
        self.id = backend.new_id()
        self._owner = backend
        self._destroyed = False
        self._killed = False
        self._used = False
        self.bundle = backend.bundles / self.id
        gvisor = backend.runtime == "runsc"
        self._memory_bytes = (limits.memory_mb + (GVISOR_MEMORY_HEADROOM_MB if gvisor else 0)) * 1024 * 1024
        self._pids = limits.max_processes + (GVISOR_PIDS_HEADROOM if gvisor else 0)
        socket_input = backend.runtime == "runc"  # runsc: frames only, over its stdio (see INPUT_FD)
        # runsc cannot receive memfds: its large context values come through a hand-off directory instead.
        self._handoff: handoff.HandoffDir | None = None
        if gvisor:
            try:
                self._handoff = handoff.HandoffDir()
            except OSError as exc:  # large values then travel as frames
                log.debug("no hand-off directory: %s", exc)
        spec = oci_spec.container_spec(
            rootfs=backend.rootfs,
            args=[*COMMAND, "--input-fd", str(INPUT_FD)] if socket_input else list(COMMAND),
            limits=limits,
            uid=backend.config.sandbox_uid,
            gid=backend.config.sandbox_gid,
            cgroups_path=None,
            memory_headroom_mb=GVISOR_MEMORY_HEADROOM_MB if gvisor else 0,
            pids_headroom=GVISOR_PIDS_HEADROOM if gvisor else 0,
            handoff_source=str(self._handoff.path) if self._handoff else None,
            env_source=environment.site if environment is not None else None,
        )
        self.bundle.mkdir(mode=0o700)
        (self.bundle / "config.json").write_text(json.dumps(spec))
        run = [*backend.command(), "run", "--bundle", str(self.bundle), self.id]
        host_end: socket.socket | None = None
        stdin: int = subprocess.PIPE
        if socket_input:
            host_end, stdin = socket_channel()
            run = [*_WITH_INPUT_FD, *backend.command(), "run", "--preserve-fds", "1", *run[-3:]]
        try:
            self.proc = subprocess.Popen(
                run,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=RUNTIME_ENV,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            shutil.rmtree(self.bundle, ignore_errors=True)
            if self._handoff is not None:
                self._handoff.remove()
            if host_end is not None:
                host_end.close()
            raise SandboxUnavailable(f"could not start {backend.runtime}: {exc}", retriable=False) from exc
        finally:
            if host_end is not None:
                os.close(stdin)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        streams: dict[int, Stream] = {self.proc.stdout.fileno(): "result", self.proc.stderr.fileno(): "stderr"}
        widen_pipe(self.proc.stdout.fileno())
        if host_end is not None:
            self.io: PipeIO = SocketIO(host_end, streams)
        else:
            assert self.proc.stdin is not None
            widen_pipe(self.proc.stdin.fileno())
            self.io = PipeIO(self.proc.stdin.fileno(), streams)
        try:
            self._start(backend.config, limits)
        except BaseException:
            self.destroy()
            raise

    def _start(self, config: SandboxConfig, limits: Limits) -> None:
        try:
            boot_frame = encode_frame(self.boot_frame(limits), MAX_BOOT_BYTES)
            self.io.send(boot_frame, time.monotonic() + config.spawn_timeout_s)
            ready = await_ready(self.io, limits, config.spawn_timeout_s)
        except (ProtocolError, OSError) as exc:
            raise SandboxUnavailable(f"sandbox container failed to start ({self._owner.runtime}): {exc}") from exc
        if ready.handoff:
            self.io.handoff = self._handoff
        pid = self._container_pid()
        seen = host_view(pid, limits, memory_bytes=self._memory_bytes, pids=self._pids) if pid else {}
        if self._owner.runtime == "runsc":
            # The host sees the gVisor sandbox process (the sentry), not the program: the walls it can check
            # are the sentry's (namespaces, cgroup limits, its root). Inside the sentry, the runner reports its
            # own lock-down; the root and /tmp mounts are gVisor's implementation of the spec we wrote.
            for name in RUNNER_WALLS:
                seen[name] = ready.protections.get(name, False)
            for name in (P.READ_ONLY_ROOTFS, P.TMPFS_LIMITED):
                seen[name] = True
            seen[P.CAPABILITIES_DROPPED] = True  # the spec grants none, and the app runs on gVisor's kernel
            seen[P.GVISOR] = pid is not None
            seen[P.PID_NAMESPACE] = ready.pid == 1  # pid 1 of the sentry's own pid namespace
        else:
            for name in RUNNER_WALLS:
                seen[name] = seen.get(name, False) and ready.protections.get(name, False)
        seen[P.AUDIT_TRIPWIRE] = ready.protections.get(P.AUDIT_TRIPWIRE, False)  # self-tested; doctor's canary
        self.protections = {**protections.unverified(self.backend), **seen}
        protections.require(self.backend, self.protections, config.enforced_protections, ready.errors)
        runc = self._owner.runtime == "runc" and pid is not None  # runsc: the host sees the sentry only
        require_mounted(self.backend, self.environment, ready, verify.mounts(pid) if runc and pid else None)

    def _container_pid(self) -> int | None:
        """The process to inspect: the container's own (runc) or the gVisor sandbox process (runsc)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=self._owner.runtime == "runsc")
        except psutil.Error:
            return None
        if self._owner.runtime == "runc":
            return children[0].pid if len(children) == 1 else None
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "boot" in child.cmdline():
                    return child.pid
        return None

    def boot_frame(self, limits: Limits) -> BootFrame:
        """As in the Docker backend: namespaces, root and user are the container's; the runner adds rlimits,
        no_new_privs and its own seccomp filter (which also denies execve)."""
        return boot.container_boot(limits, self._handoff, self.environment)

    # -- the Worker protocol --

    def alive(self) -> bool:
        return not self._destroyed and self.proc.poll() is None

    def execute(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        return run_steps(self.steps(request, bridge))

    def steps(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> Steps[ExecutionOutcome]:
        """The execution as steps (``sandbox/steps.py``): ``execute`` drives them on its thread, the async API
        on the event loop."""
        try:
            if not self.alive():
                return died_before_use(self.backend, "sandbox container")
            self._used = True
            ex = yield from exchange_steps(self.io, request, bridge)
            if ex.failure is not None:
                self._kill()
            # The channel ended with the runtime's exit (it holds the stream until it has deleted the
            # container), so its status is usually in already; it is the container process's.
            exit_info = self._exited()
            if exit_info is None:
                exit_info = yield Blocking(functools.partial(self._exit_info, grace_s=EXIT_GRACE_S))
            outcome = build_outcome(
                ex, exit_info, backend=self.backend, protections=self.protections, limits=self.limits
            )
            outcome.metadata["container_id"] = self.id
            if exit_info.oom_killed:
                outcome.metadata["oom_killed"] = True
            return outcome
        finally:
            self.destroy()

    def _exited(self) -> ExitInfo | None:
        """The exit, if the runtime has ended already (never waits)."""
        code = self.proc.poll()
        return None if code is None else self._exit_of(code)

    def _exit_info(self, grace_s: float) -> ExitInfo:
        try:
            code = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._kill()
            try:
                code = self.proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                return ExitInfo()
        return self._exit_of(code)

    def _exit_of(self, code: int) -> ExitInfo:
        """The runtime's exit status as the container process's: it exits with that status (128 + the signal
        for a process killed by one)."""
        sig = -code if code < 0 else (code - 128 if 128 < code < 160 else None)
        # Inside the container nothing but the kernel's OOM killer sends SIGKILL (the runtime forwards ours
        # only when we kill): a SIGKILL we did not send is the memory cgroup's.
        oom = sig == signal.SIGKILL and not self._killed
        return ExitInfo(exit_code=code if code >= 0 else None, signal=sig, oom_killed=oom)

    def _kill(self) -> None:
        """SIGKILL the container's process: with runc, the container's init, whose death ends everything in
        its pid namespace; with runsc, the gVisor sandbox. The runtime then exits and deletes the container;
        the reaper force-deletes it as well, in case the runtime cannot."""
        self._killed = True
        pid = self._container_pid()
        if pid is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    def kill(self) -> None:
        if not self._destroyed:
            self._kill()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.io.close()
        if not self._used and self.proc.poll() is None:
            self._kill()  # never used (pool closing, failed start): nothing to wait for
        owner = self._owner
        proc, bundle, cid, handed = self.proc, self.bundle, self.id, self._handoff
        delete = (lambda: owner.force_delete(cid)) if self._killed else None
        _REAPER.submit(lambda: _finish(proc, bundle, delete, handed))


# --- the backend -----------------------------------------------------------------------------------------


class OciBackend:
    """Containers run by ``runc`` or ``runsc`` directly (backends ``runc`` and ``runsc``)."""

    def __init__(self, config: SandboxConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.name: str = runtime
        self.tag = image.expected_tag(config.image)
        self.rootfs = image.oci_rootfs(self.tag)
        self.state = STATE_DIR / runtime
        self.bundles = STATE_DIR / "bundles"
        self._binary = shutil.which(runtime)
        self._tag = process_tag()
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        _BACKENDS.add(self)

    def command(self) -> list[str]:
        assert self._binary is not None
        return command_with(self._binary, self.runtime)

    def new_id(self) -> str:
        return f"{ID_PREFIX}-{self._tag}-{next(_IDS)}"

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None when it can."""
        if os.geteuid() != 0:
            return f"the {self.runtime} backend needs root (rootless containers are not supported)"
        if self._binary is None:
            return f"{self.runtime} is not installed (apt-get install {self.runtime})"
        if not (self.rootfs / image.IMAGE_ENTRY.lstrip("/")).exists():
            return (
                f"the sandbox image {self.tag} is not unpacked for {self.runtime} at {self.rootfs}; {image.BUILD_HINT}"
            )
        return None

    def _prepare(self) -> None:
        with self._lock:
            if self._closed:
                raise SandboxUnavailable(f"the {self.name} backend is closed", retriable=False)
            if self._ready:
                return
            reason = self.unavailable_reason()
            if reason is not None:
                raise SandboxUnavailable(reason, retriable=False)
            for path in (self.state, self.bundles):
                path.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._ready = True
        # Containers, bundles and directories of processes that died without cleaning up (every kind, not
        # only this backend's: see sandbox/leftovers.py).
        leftovers.reap_in_background()

    def force_delete(self, container_id: str) -> None:
        force_delete(self.runtime, container_id)

    def spawn(self, limits: Limits, environment: MountedEnvironment | None = None) -> OciWorker:
        self._prepare()
        return OciWorker(self, limits, environment)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        _REAPER.drain(timeout=30.0)


__all__ = ["OciBackend", "OciWorker", "host_view"]
