"""The `docker` (runc) and `gvisor` (runsc) backends: one disposable container per execution.

Each worker is a container created from the exact expected sandbox image (``sandbox/image.py``), with no
network, a read-only root, a size-limited noexec ``/tmp``, no capabilities, no-new-privileges, a
non-root user and pids/memory (no swap)/CPU limits; its only mount is its own read-only hand-off directory
for large context values (``sandbox/handoff.py``). Its stdin, stdout and stderr are attached *before*
it starts; the runner (``--result-stdout``) keeps the container's stdout as the result channel and points
its own stdout at stderr before any program runs, so printing cannot forge a result. The host reads the
attach stream to its end and judges the result with the container's exit status, which the engine's wait,
asked as soon as the container runs, gives (``ExitWatch``); after a failure the container is killed and
inspected (exit code, OOM kill) instead. Then it is removed, on a background thread so removal stays off the
hot path; leftovers are removed at pool close and at interpreter exit,
and containers of dead processes (label ``sandforge.owner``) are reaped when a backend starts.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import struct
import threading
import time
import weakref
from pathlib import PurePosixPath
from typing import Any

from sandforge.sandbox import boot, handoff, image, leftovers, protections, verify
from sandforge.sandbox.channel import Stream, WorkerIO, send_deadline, wait_fd
from sandforge.sandbox.cleanup import CleanupQueue
from sandforge.sandbox.config import SandboxConfig
from sandforge.sandbox.containers import (
    COMMAND,
    GVISOR_MEMORY_HEADROOM_MB,
    GVISOR_PIDS_HEADROOM,
    LABEL,
    OWNER_LABEL,
    SANDBOX_USER,
    SCRATCH,
)
from sandforge.sandbox.docker_engine import connect, engine_errors, remove_container
from sandforge.sandbox.environment import ENV_MOUNT_PATH, MountedEnvironment, require_mounted
from sandforge.sandbox.errors import SandboxUnavailable
from sandforge.sandbox.exchange import (
    END_GRACE_S,
    EXIT_GRACE_S,
    BridgeHandler,
    ExitInfo,
    await_ready,
    build_outcome,
    died_before_use,
    run_exchange,
)
from sandforge.sandbox.inside.wire import MAX_BOOT_BYTES
from sandforge.sandbox.ownership import host_owner, host_owner_alive
from sandforge.sandbox.protections import Protection as P
from sandforge.sandbox.protocol import (
    BootFrame,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    ProtocolError,
    encode_frame,
)

log = logging.getLogger(__name__)

#: Killing a container and waiting for it to stop: dockerd answers in milliseconds once nothing blocks it.
KILL_TIMEOUT_S = 5.0
#: Connections kept for exit watches (one per live container; beyond it a connection is made and dropped).
WAIT_CONNECTIONS = 64
_STREAMS: dict[int, Stream] = {1: "result", 2: "stderr"}
_MUX_HEADER = struct.Struct(">BxxxI")


_REMOVER = CleanupQueue("sandforge-docker-remover")
_BACKENDS: weakref.WeakSet[DockerBackend] = weakref.WeakSet()
_EXITING = False


@atexit.register
def _close_all_at_exit() -> None:
    global _EXITING
    _EXITING = True
    for backend in list(_BACKENDS):
        with contextlib.suppress(Exception):
            backend.close()
    _REMOVER.drain(timeout=30.0)


def reap_leftovers(api: Any, *, everything: bool = False) -> list[str]:
    """Remove sandforge containers whose owning process is gone (or all of them with ``everything``)."""
    removed: list[str] = []
    for info in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        owner = (info.get("Labels") or {}).get(OWNER_LABEL, "")
        if (everything or not owner or not host_owner_alive(owner)) and remove_container(api, info["Id"]):
            removed.append(info["Id"])
    return removed


# --- the attach socket ------------------------------------------------------------------------------


class AttachIO(WorkerIO):
    """WorkerIO over Docker's attach socket: frames go to stdin; stdout (results) and stderr come back
    multiplexed with 8-byte headers (stream id, 3 bytes padding, big-endian length)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw  # keeps the HTTP response (and so the socket) alive
        sock = getattr(raw, "_sock", raw)
        if not isinstance(sock, socket.socket):
            raise SandboxUnavailable(
                "unsupported Docker transport for attaching (use a unix or tcp socket)", retriable=False
            )
        self.sock = sock
        self.sock.setblocking(False)  # every read and write waits in select, bounded by a deadline
        self._buf = bytearray()
        self._stream: Stream | None = None
        self._left = 0
        self.eof = False
        #: Set once the runner confirmed the container's hand-off directory (``send_execute`` uses it).
        self.handoff: handoff.HandoffDir | None = None

    def send(self, data: bytes, deadline: float | None = None) -> None:
        """All of ``data`` by ``deadline``; TimeoutError when the container (or dockerd) stops taking it."""
        until = send_deadline(deadline)
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                remaining = until - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the sandbox container stopped reading its input") from None
                wait_fd(self.sock, remaining, write=True)

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        if self.eof:
            time.sleep(min(timeout, 0.01))
            return []
        if not wait_fd(self.sock, timeout):
            return []
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return [("result", b""), ("stdout", b""), ("stderr", b"")]
        return self._demux(data)

    def _demux(self, data: bytes) -> list[tuple[Stream, bytes]]:
        chunks: list[tuple[Stream, bytes]] = []
        self._buf += data
        while self._buf:
            if self._left == 0:
                if len(self._buf) < _MUX_HEADER.size:
                    break
                kind, size = _MUX_HEADER.unpack_from(self._buf)
                del self._buf[: _MUX_HEADER.size]
                self._stream, self._left = _STREAMS.get(kind), size
                continue
            take = bytes(self._buf[: self._left])
            del self._buf[: len(take)]
            self._left -= len(take)
            if take and self._stream is not None:
                chunks.append((self._stream, take))
        return chunks

    def closed_by_peer(self) -> bool:
        """True when the engine closed the stream (the container ended); never consumes data."""
        if self.eof:
            return True
        try:
            if not wait_fd(self.sock, 0):
                return False
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self._raw.close()


# --- protections -----------------------------------------------------------------------------------


def verify_protections(
    attrs: dict[str, Any],
    claimed: dict[str, bool],
    *,
    runtime: str | None,
    host_pid_checked: dict[str, bool] | None,
    env_source: str | None = None,
) -> dict[str, bool]:
    """What the engine reports for this container, plus the runner's lock-down claims.

    ``host_pid_checked`` (runc on this machine only) holds the runner's seccomp/no_new_privs/rlimits as
    read from ``/proc`` of the container's process; a claim it contradicts counts as absent.
    """
    hc: dict[str, Any] = attrs.get("HostConfig") or {}
    cfg: dict[str, Any] = attrs.get("Config") or {}
    caps = {str(c).upper().removeprefix("CAP_") for c in hc.get("CapDrop") or []}
    secopts = [str(o) for o in hc.get("SecurityOpt") or []]
    user = str(cfg.get("User") or "")
    uid = user.split(":", 1)[0]
    tmpfs = (hc.get("Tmpfs") or {}).get(SCRATCH, "")
    memory = int(hc.get("Memory") or 0)
    no_mounts = not hc.get("Binds") and all(
        _is_handoff_mount(m) or _is_env_mount(m, env_source) for m in hc.get("Mounts") or []
    )
    p: dict[str, bool] = {
        P.NETWORK_NONE: hc.get("NetworkMode") == "none",
        P.READ_ONLY_ROOTFS: hc.get("ReadonlyRootfs") is True,
        P.TMPFS_LIMITED: "size=" in tmpfs and "noexec" in tmpfs,
        P.CAPABILITIES_DROPPED: "ALL" in caps and not hc.get("CapAdd") and not hc.get("Privileged"),
        P.NO_NEW_PRIVS: any(
            o in ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true") for o in secopts
        )
        and claimed.get(P.NO_NEW_PRIVS, False),
        P.UNPRIVILEGED_USER: uid not in ("", "0", "root") and claimed.get(P.UNPRIVILEGED_USER, False),
        P.MEMORY_LIMIT: memory > 0,
        P.NO_SWAP: memory > 0 and int(hc.get("MemorySwap") or 0) == memory,
        P.PIDS_LIMIT: int(hc.get("PidsLimit") or 0) > 0,
        P.CPU_LIMIT: int(hc.get("NanoCpus") or 0) > 0 or int(hc.get("CpuQuota") or 0) > 0,
        P.SECCOMP: claimed.get(P.SECCOMP, False) and "seccomp=unconfined" not in secopts,
        P.RLIMITS: claimed.get(P.RLIMITS, False),
        P.PRIVATE_ROOT: hc.get("ReadonlyRootfs") is True and no_mounts,
        P.NET_NAMESPACE: hc.get("NetworkMode") == "none",
        P.MOUNT_NAMESPACE: True,
        P.IPC_NAMESPACE: hc.get("IpcMode") != "host",
        P.UTS_NAMESPACE: hc.get("UTSMode") != "host",
        P.PID_NAMESPACE: hc.get("PidMode") != "host",
        P.AUDIT_TRIPWIRE: claimed.get(P.AUDIT_TRIPWIRE, False),  # the runner's self-test; doctor's canary
    }
    if host_pid_checked is not None:
        for name, ok in host_pid_checked.items():
            p[name] = p.get(name, False) and ok
    if runtime == "runsc":
        p[P.GVISOR] = hc.get("Runtime") == "runsc"
    return p


def _is_handoff_mount(mount: dict[str, Any]) -> bool:
    """The one mount a container may have: its own hand-off directory, read-only (``sandbox/handoff.py``)."""
    source = PurePosixPath(str(mount.get("Source") or ""))
    return (
        mount.get("Type") == "bind"
        and mount.get("Target") == handoff.MOUNT_POINT
        and mount.get("ReadOnly") is True
        and source.name == "in"
        and source.parent.name.startswith(handoff.PREFIX)
    )


def _is_env_mount(mount: dict[str, Any], env_source: str | None) -> bool:
    """The container's environment, read-only at its fixed path, from exactly the checked site directory."""
    return (
        env_source is not None
        and mount.get("Type") == "bind"
        and mount.get("Target") == ENV_MOUNT_PATH
        and mount.get("ReadOnly") is True
        and mount.get("Source") == env_source
    )


def _mount_refused(exc: Any) -> bool:
    """Whether the engine refused a container because of its bind mount (a path it cannot see)."""
    text = str(getattr(exc, "explanation", None) or exc).lower()
    return "bind source path" in text or "invalid mount config" in text or ("mount" in text and "not exist" in text)


def _host_view(pid: int, container_id: str) -> dict[str, bool] | None:
    """For runc on this machine: the container's process as /proc sees it (None when not visible here)."""
    return verify.process_walls(pid) if verify.in_cgroup_of(pid, container_id) else None


# --- the container's exit -----------------------------------------------------------------------------


class ExitWatch:
    """The engine's wait for one container to stop, asked as soon as it runs, on a thread of its own (the
    answer comes only when the container stops). An ok result is judged with this exit status; dockerd
    gives it just after it closes the attach stream, so asked ahead it is in within milliseconds of the
    channel's end, where asking then would add a round trip to the engine (~20 ms under load)."""

    def __init__(self, api: Any, cid: str) -> None:
        self._done = threading.Event()
        self._status: int | None = None
        threading.Thread(target=self._wait, args=(api, cid), name="sandforge-exit-watch", daemon=True).start()

    def _wait(self, api: Any, cid: str) -> None:
        try:
            self._status = int(api.wait(cid, timeout=None)["StatusCode"])
        except Exception as exc:  # the engine, or the container removed meanwhile: the caller inspects instead
            log.debug("waiting for container %s failed: %s", cid[:12], exc)
        finally:
            self._done.set()

    def status(self, timeout: float) -> int | None:
        """The container's exit status, waiting up to ``timeout``; None when the engine did not say."""
        self._done.wait(timeout)
        return self._status


def _exit_of(code: int, oom_killed: bool = False) -> ExitInfo:
    """An engine's exit code (128 + the signal for a process killed by one) as an ``ExitInfo``."""
    sig = code - 128 if 128 < code < 160 else None
    return ExitInfo(exit_code=code, signal=sig, oom_killed=oom_killed)


# --- the worker -----------------------------------------------------------------------------------


class ContainerWorker:
    """One container, started and locked down, waiting for its single execution."""

    def __init__(self, backend: DockerBackend, limits: Limits, environment: MountedEnvironment | None = None) -> None:
        self.backend = backend.name
        self.limits = limits
        self.environment = environment
        self.created_at = time.monotonic()
        self._created_wall = time.time()
        self.protections: dict[str, bool] = {}
        self._owner = backend
        self._api = backend.api()
        self._destroyed = False
        self._io: AttachIO | None = None
        self._exit: ExitWatch | None = None
        self._handoff: handoff.HandoffDir | None = None
        self.verified_from_host = False
        self._host_pid = 0
        self.id = ""
        try:
            self.id = self._create(backend, limits)
        except BaseException:
            self._drop_handoff()
            raise
        try:
            self._start(backend.config, limits)
        except BaseException:
            self.destroy()
            raise

    # -- start-up --

    def _create(self, backend: DockerBackend, limits: Limits) -> str:
        import docker.errors

        if backend.handoff_possible():
            try:
                self._handoff = handoff.HandoffDir()
            except OSError as exc:  # large values then travel as frames
                log.debug("no hand-off directory: %s", exc)
        try:
            try:
                created = self._create_container(backend, limits)
            except docker.errors.APIError as exc:
                if self._handoff is None or not _mount_refused(exc):
                    raise
                # The engine cannot see this machine's path (rootless, remote behind a local socket): no
                # hand-off directories for this backend from now on; frames carry the values.
                log.info("the Docker engine cannot mount hand-off directories (%s); sending values as frames", exc)
                backend.handoff_refused = True
                self._drop_handoff()
                created = self._create_container(backend, limits)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(backend.missing_image_message(), retriable=True) from exc
        except docker.errors.APIError as exc:
            raise backend.translate(exc) from exc
        except engine_errors() as exc:
            raise backend.engine_down(exc) from exc
        cid = str(created["Id"])
        if not backend.track(cid, self._handoff):  # closed meanwhile (pool shutting down, interpreter exiting)
            remove_container(self._api, cid)
            raise SandboxUnavailable(f"the {backend.name} backend is closed", retriable=False)
        return cid

    def _create_container(self, backend: DockerBackend, limits: Limits) -> dict[str, Any]:
        from docker.types import LogConfig, Mount

        gvisor = backend.runtime == "runsc"
        memory = limits.memory_mb + (GVISOR_MEMORY_HEADROOM_MB if gvisor else 0)
        mounts = []
        if self._handoff is not None:
            mounts.append(Mount(handoff.MOUNT_POINT, str(self._handoff.path), type="bind", read_only=True))
        if self.environment is not None:
            mounts.append(Mount(ENV_MOUNT_PATH, self.environment.site, type="bind", read_only=True))
        host_config = self._api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={SCRATCH: f"size={limits.disk_mb}m,mode=1777,noexec,nosuid,nodev"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=limits.max_processes + (GVISOR_PIDS_HEADROOM if gvisor else 0),
            mem_limit=f"{memory}m",
            memswap_limit=f"{memory}m",
            nano_cpus=int(limits.cpus * 1e9),
            ipc_mode="none",
            runtime=backend.runtime,
            log_config=LogConfig(type="none"),
            mounts=mounts,
        )
        created: dict[str, Any] = self._api.create_container(
            image=backend.tag,
            command=COMMAND,
            user=SANDBOX_USER,
            stdin_open=True,
            tty=False,
            environment=[],
            working_dir=SCRATCH,
            hostname="sandbox",
            network_disabled=True,
            labels={LABEL: "1", OWNER_LABEL: backend.owner, "sandforge.backend": backend.name},
            host_config=host_config,
            use_config_proxy=False,
        )
        return created

    def _start(self, config: SandboxConfig, limits: Limits) -> None:
        import docker.errors

        owner = self._owner
        try:
            # Attach strictly before start: nothing can be lost, and the HTTP layer cannot have buffered any
            # stream bytes past the upgrade response (AttachIO reads the raw socket from here on).
            raw = self._api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._io = AttachIO(raw)
            self._api.start(self.id)
            self._exit = ExitWatch(owner.wait_api(), self.id)
        except docker.errors.APIError as exc:
            raise owner.translate(exc) from exc
        except engine_errors() as exc:
            raise owner.engine_down(exc) from exc
        try:
            boot_frame = encode_frame(self.boot_frame(limits), MAX_BOOT_BYTES)
            self._io.send(boot_frame, time.monotonic() + config.spawn_timeout_s)
            attrs = self._api.inspect_container(self.id)  # overlaps the interpreter's start-up
            ready = await_ready(self._io, limits, config.spawn_timeout_s)
        except (ProtocolError, OSError) as exc:
            raise SandboxUnavailable(f"sandbox container failed to start: {exc}") from exc
        except engine_errors() as exc:
            raise owner.engine_down(exc) from exc
        if ready.handoff:
            self._io.handoff = self._handoff
        else:
            self._drop_handoff()
        host_view = None
        pid = int((attrs.get("State") or {}).get("Pid") or 0)
        if owner.runtime is None and pid > 0:
            host_view = _host_view(pid, self.id)
        self.verified_from_host = host_view is not None
        self._host_pid = pid if host_view is not None else 0  # runc here: killed directly (see _kill)
        env = self.environment
        self.protections = verify_protections(
            attrs, ready.protections, runtime=owner.runtime, host_pid_checked=host_view,
            env_source=env.site if env is not None else None,
        )  # fmt: skip
        protections.require(owner.name, self.protections, config.enforced_protections, ready.errors)
        require_mounted(owner.name, env, ready, verify.mounts(pid) if host_view is not None else None)

    def boot_frame(self, limits: Limits) -> BootFrame:
        """The runner's lock-down inside the container: rlimits, no_new_privs and seccomp (namespaces, root
        and the unprivileged user are the container's own)."""
        return boot.container_boot(limits, self._handoff, self.environment)

    # -- the Worker protocol --

    def alive(self) -> bool:
        return not self._destroyed and self._io is not None and not self._io.closed_by_peer()

    def execute(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        try:
            if not self.alive() or self._io is None:
                return died_before_use(self.backend, "sandbox container")
            ex = run_exchange(self._io, request, bridge)
            status = None
            if ex.result is not None and ex.failure is None and self._exit is not None:
                status = self._exit.status(END_GRACE_S)  # the attach stream ended: it is in, or nearly
            if status is not None:
                exit_info = _exit_of(status)
            else:
                if ex.failure is not None:
                    self._kill()
                exit_info, engine_error = self._exit_info(grace_s=EXIT_GRACE_S)
                if ex.result is None and ex.failure is None and exit_info.signal == 9 and not exit_info.oom_killed:
                    exit_info.oom_killed = self._oom_event_seen()
                if engine_error and ex.failure is None:
                    ex.failure = (
                        ErrorType.SANDBOX_UNAVAILABLE,
                        f"lost the Docker engine during execution: {engine_error}",
                    )
            outcome = build_outcome(
                ex, exit_info, backend=self.backend, protections=self.protections, limits=self.limits
            )
            outcome.metadata["container_id"] = self.id[:12]
            if exit_info.oom_killed:
                outcome.metadata["oom_killed"] = True
            return outcome
        except OSError as exc:  # the attach socket broke mid-exchange (e.g. a nested-call reply)
            self._kill()
            return ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE,
                f"lost the connection to the sandbox container: {exc}",
                backend=self.backend,
            )
        finally:
            self.destroy()

    def _kill(self) -> None:
        """Stop the container now. The attach stream is closed first: dockerd copies the container's output
        to it, and with a reader that stopped reading (after the output limit) that copy blocks the kill and
        the wait for the API's whole timeout, twice (about 60 s). Then SIGKILL the container's process
        directly when this machine sees it (runc), else ask dockerd, with a short timeout."""
        if self._io is not None:
            self._io.close()
        pid = self._host_pid
        if pid and verify.in_cgroup_of(pid, self.id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                return
        with contextlib.suppress(Exception):
            self._owner.quick_api().kill(self.id)

    def _exit_info(self, grace_s: float) -> tuple[ExitInfo, str | None]:
        """Exit code and OOM kill from the engine; waits (then kills) if the container is still running."""
        import requests

        try:
            state = self._api.inspect_container(self.id)["State"]
            if state.get("Running"):
                try:
                    self._api.wait(self.id, timeout=grace_s)
                except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                    self._kill()
                    self._owner.quick_api().wait(self.id, timeout=KILL_TIMEOUT_S)
                state = self._api.inspect_container(self.id)["State"]
        except engine_errors() as exc:
            return ExitInfo(), str(exc)
        return _exit_of(int(state.get("ExitCode") or 0), bool(state.get("OOMKilled"))), None

    def _oom_event_seen(self, wait_s: float = 1.5) -> bool:
        """Killed without a result and not by us: was it the cgroup's OOM killer?

        The engine records State.OOMKilled only when the OOM event beats the exit event, which under gVisor
        it often does not; the ``oom`` event itself still arrives, so look for it in the engine's event log.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                events = self._api.events(
                    since=int(self._created_wall) - 2,
                    until=f"{time.time():.6f}",
                    filters={"container": self.id, "event": "oom"},
                    decode=True,
                )
                if any(e.get("status") == "oom" or e.get("Action") == "oom" for e in events):
                    return True
            except engine_errors():
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def kill(self) -> None:
        if not self._destroyed:
            self._kill()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        if self._io is not None:
            self._io.close()
        if self.id:
            self._owner.remove(self.id)  # and its hand-off directory after it
        else:
            self._drop_handoff()

    def _drop_handoff(self) -> None:
        if self._handoff is not None:
            self._handoff.remove()
            self._handoff = None


# --- the backend ----------------------------------------------------------------------------------


class DockerBackend:
    """Containers through the Docker SDK; ``runtime="runsc"`` runs them under gVisor (backend ``gvisor``)."""

    def __init__(self, config: SandboxConfig, runtime: str | None = None) -> None:
        self.config = config
        self.runtime = runtime
        self.name = "gvisor" if runtime == "runsc" else "docker"
        self.tag = image.expected_tag(config.image)
        self.owner = host_owner()
        self._api: Any = None
        self._quick_api: Any = None
        self._wait_api: Any = None
        self._lock = threading.Lock()
        self._live: dict[str, handoff.HandoffDir | None] = {}  # container id -> its hand-off directory
        self._checked_runtime = False
        self._closed = False
        self.handoff_refused = False
        _BACKENDS.add(self)

    def handoff_possible(self) -> bool:
        """A hand-off directory can only be mounted by an engine on this machine (a unix socket) that has
        not refused one; the runner's token check still confirms that the engine sees the host's path."""
        return not self.handoff_refused and str(getattr(self._api, "base_url", "")) == "http+docker://localhost"

    # -- engine access --

    def quick_api(self) -> Any:
        """A second client whose calls time out after ``KILL_TIMEOUT_S``: for kill and the wait after it."""
        with self._lock:
            if self._quick_api is None:
                self._quick_api = connect(self.config.docker_base_url, timeout=KILL_TIMEOUT_S)
            return self._quick_api

    def wait_api(self) -> Any:
        """A client for the containers' exit watches (``ExitWatch``): each holds a connection until its
        container stops, so they get a pool of their own, as large as a busy pool of containers."""
        with self._lock:
            if self._wait_api is None:
                self._wait_api = connect(self.config.docker_base_url, max_pool_size=WAIT_CONNECTIONS)
            return self._wait_api

    def api(self) -> Any:
        with self._lock:
            if self._closed or _EXITING:
                raise SandboxUnavailable(f"the {self.name} backend is closed", retriable=False)
            if self._api is None:
                api = connect(self.config.docker_base_url)
                self._api = api
                leftovers.reap_in_background()  # of dead processes, every kind (sandbox/leftovers.py)
            api = self._api
        if self.runtime and not self._checked_runtime:
            self._check_runtime(api)
        return api

    def _check_runtime(self, api: Any) -> None:
        try:
            runtimes = api.info().get("Runtimes") or {}
        except engine_errors() as exc:
            raise self.engine_down(exc) from exc
        if self.runtime not in runtimes:
            raise SandboxUnavailable(
                f"the Docker engine has no {self.runtime!r} runtime registered (have: {', '.join(sorted(runtimes))}); "
                "add it to /etc/docker/daemon.json and reload dockerd",
                retriable=False,
            )
        self._checked_runtime = True

    def engine_down(self, exc: BaseException) -> SandboxUnavailable:
        return SandboxUnavailable(f"Docker engine unavailable: {exc}", retriable=True)

    def translate(self, exc: Any) -> SandboxUnavailable:
        """An engine APIError as a SandboxUnavailable with a useful message."""
        text = str(getattr(exc, "explanation", None) or exc)
        if "unknown runtime" in text.lower():
            return SandboxUnavailable(
                f"the Docker engine does not know the {self.runtime!r} runtime: {text}", retriable=False
            )
        if getattr(exc, "status_code", None) == 404 and "image" in text.lower():
            return SandboxUnavailable(self.missing_image_message(), retriable=True)
        return SandboxUnavailable(f"the Docker engine refused to run the sandbox: {text}", retriable=True)

    def missing_image_message(self) -> str:
        stale: list[str] = []
        with contextlib.suppress(Exception):
            stale = image.status(self._api, self.config.image).stale
        return image.missing_image_message(self.tag, stale)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (engine, runtime, image), or None when it can."""
        import docker.errors

        try:
            api = self.api()
            api.inspect_image(self.tag)
        except SandboxUnavailable as exc:
            return str(exc)
        except docker.errors.ImageNotFound:
            return self.missing_image_message()
        except engine_errors() as exc:
            return str(self.engine_down(exc))
        return None

    # -- containers --

    def track(self, cid: str, handed: handoff.HandoffDir | None) -> bool:
        """Remember a created container (and its hand-off directory) until it is removed; False when the
        backend is already closed."""
        with self._lock:
            if self._closed:
                return False
            self._live[cid] = handed
            return True

    def remove(self, cid: str) -> None:
        """Queue a container for removal (forced, so it also kills), then its hand-off directory's; close()
        waits for it."""
        api = self._api
        _REMOVER.submit(lambda: self._remove_now(api, cid))

    def _remove_now(self, api: Any, cid: str) -> None:
        if remove_container(api, cid):
            with self._lock:
                handed = self._live.pop(cid, None)
            if handed is not None:
                handed.remove()

    def live_containers(self) -> set[str]:
        with self._lock:
            return set(self._live)

    def spawn(self, limits: Limits, environment: MountedEnvironment | None = None) -> ContainerWorker:
        return ContainerWorker(self, limits, environment)

    def close(self) -> None:
        """Wait for this backend's containers to be removed (removing any stragglers now)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            api = self._api
        if api is None:
            return
        _REMOVER.drain(timeout=30.0)
        for cid in self.live_containers():
            self._remove_now(api, cid)
        with contextlib.suppress(Exception):
            api.close()
        for client in (self._quick_api, self._wait_api):
            with contextlib.suppress(Exception):
                if client is not None:
                    client.close()


__all__ = [
    "AttachIO", "ContainerWorker", "DockerBackend", "reap_leftovers",
    "verify_protections",
]  # fmt: skip
