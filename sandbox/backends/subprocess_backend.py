"""The `subprocess` backend: one never-reused, locked-down Python process per execution.

The runner locks itself down after boot (see ``sandbox/inside/lockdown.py``); this module starts it with no
environment and no inherited descriptors, then verifies from the outside, through ``/proc``, which
protections are really in force, and refuses workers that lack one the configuration requires.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import RestrictedPython

from sandforge.sandbox import boot, leftovers, protections, seam, verify
from sandforge.sandbox.channel import SocketIO, Stream, result_channel, socket_channel
from sandforge.sandbox.config import SandboxConfig
from sandforge.sandbox.environment import MountedEnvironment, require_mounted
from sandforge.sandbox.envzygotes import ConfinedZygote, EnvZygotes, confinable
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
from sandforge.sandbox.protections import Protection as P
from sandforge.sandbox.protocol import (
    BootFrame,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    ProtocolError,
    ReadyFrame,
    ResourceUsage,
    encode_frame,
)
from sandforge.sandbox.steps import Blocking, Steps, run_steps, then_destroy
from sandforge.sandbox.zygote import Zygote, ZygoteError

log = logging.getLogger(__name__)

#: How long an environment zygote may take to import its modules and report ready (pandas: seconds, under load
#: tens of seconds), at least.
ENV_ZYGOTE_START_S = 120.0
#: Large input files go to the runner as frames it writes onto its huge-page tmpfs as they come: cheaper than
#: filling a memfd, a small page per 4 KiB (docs/files.md, "How the bytes cross"). False: as sealed memfds, as
#: runc's do (the tests of that path set it so).
STREAMS_INPUTS = True
#: The runner: the inside package, started from its ``__main__.py`` (which imports it as ``inside``).
RUNNER = Path(__file__).resolve().parent.parent / "inside" / "__main__.py"


class SubprocessWorker:
    backend = "subprocess"

    def __init__(
        self, config: SandboxConfig, limits: Limits, runner: Path = RUNNER, zygote: Zygote | None = None,
        environment: MountedEnvironment | None = None, mount_point: Path | None = None,
    ) -> None:  # fmt: skip
        """``mount_point``: the backend's shared directory the runner mounts its private root on (see
        ``SubprocessBackend.mount_point``); without one, a work directory of this worker's own."""
        self.limits = limits
        self.environment = environment
        self.created_at = time.monotonic()
        self.protections: dict[str, bool] = {}
        self._zygote = zygote
        self._destroyed = False
        self._reaped = False
        self._held: list[int] = []  # the worker's namespaces, held open until it is destroyed (_hold_namespaces)
        #: the peak resident size its process inherited (``_popen``): not the program's, so not reported as it
        self._inherited_rss_kb = 0
        #: whether the work directory is this worker's own (removed with it), not the backend's mount point
        self.owns_workdir = mount_point is None
        self._workdir = mount_point or own_workdir(config)
        stdin_sock, stdin_r = socket_channel()
        result_sock, result_w = result_channel()  # a socket: large output files come back as descriptors
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._read_fds = (out_r, err_r)
        streams: dict[int, Stream] = {result_sock.fileno(): "result", out_r: "stdout", err_r: "stderr"}
        self.io = SocketIO(stdin_sock, streams, result_sock)
        self.io.streams_inputs = STREAMS_INPUTS
        try:
            if zygote is not None:
                booted = environment.boot(bind=True).model_dump() if environment is not None else None
                self.pid = zygote.spawn(str(self._workdir), [stdin_r, out_w, err_w, result_w], booted)
            else:
                self.pid = self._popen(config, runner, stdin_r, out_w, err_w, result_w)
        except (OSError, ZygoteError) as exc:
            self._destroyed = True
            self._close_fds()
            self._cleanup_dir()
            raise SandboxUnavailable(f"cannot start a sandbox process: {exc}", retriable=zygote is not None) from exc
        finally:
            for fd in (stdin_r, result_w, out_w, err_w):
                os.close(fd)
        boot_by = time.monotonic() + config.spawn_timeout_s
        try:
            if zygote is None:
                boot = boot_frame(config, limits, str(self._workdir), environment)
                self.io.send(encode_frame(boot, MAX_BOOT_BYTES), boot_by)
            ready = await_ready(self.io, limits, config.spawn_timeout_s)
        except (ProtocolError, OSError) as exc:
            self.destroy()
            raise SandboxUnavailable(f"sandbox worker failed to start: {exc}") from exc
        self._verify(config, ready)

    def _verify(self, config: SandboxConfig, ready: ReadyFrame) -> None:
        """Check from outside the walls the runner claims (refused: destroyed, SandboxUnavailable); hold its
        namespaces (``_hold_namespaces``)."""
        zygote = self._zygote
        wpid = self.pid if zygote is not None and zygote.born_pid1(self.pid) else _worker_pid(self.pid)
        held = _hold_namespaces(wpid)
        self._held = list(held.values())
        self.protections = verify_protections(self.pid, ready.protections, wpid, held)
        try:
            protections.require(self.backend, self.protections, config.enforced_protections, ready.errors)
            mounts = verify.mounts(wpid) if self.environment is not None else None  # read only where it is checked
            require_mounted(self.backend, self.environment, ready, mounts)
        except SandboxUnavailable as exc:
            ended = _ended(wpid)  # before ``destroy`` reaps it
            self.destroy()
            if ended:  # killed after its ready report (under load, the OOM killer): a start that failed
                died = f"sandbox worker failed to start: it died while its walls were checked ({exc})"
                raise SandboxUnavailable(died, retriable=True) from exc
            raise

    def _popen(self, config: SandboxConfig, runner: Path, stdin: int, out: int, err: int, result: int) -> int:
        python = config.python or sys.executable
        self.proc = subprocess.Popen(
            [python, "-I", "-S", "-B", str(runner), "--result-fd", str(result), *rootless_args(config)],
            stdin=stdin, stdout=out, stderr=err, env={}, cwd=self._workdir, close_fds=True,
            pass_fds=(result,), start_new_session=True,
        )  # fmt: skip
        # An exec'd image starts with its parent's peak resident size as its own (the kernel carries the old
        # address space's high-water mark across exec), so the runner's reaped usage reads at least this
        # process's peak, whatever the program used: below this, the program's peak was not observed.
        self._inherited_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self.proc.pid

    def alive(self) -> bool:
        if self._destroyed:
            return False
        if self._zygote is None:
            return self.proc.poll() is None
        return self._zygote.alive() and os.path.exists(f"/proc/{self.pid}")  # noqa: PTH110 - twice a call

    def execute(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        return run_steps(self.steps(request, bridge))

    def steps(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> Steps[ExecutionOutcome]:
        """The execution as steps (``sandbox/steps.py``): ``execute`` drives them on its thread, the async API
        on the event loop. The worker is destroyed afterwards in every case (``then_destroy``)."""
        return then_destroy(self._exchange(request, bridge), self.destroy)

    def _exchange(self, request: ExecutionRequest, bridge: BridgeHandler | None) -> Steps[ExecutionOutcome]:
        if not self.alive():
            return died_before_use(self.backend)
        ex = yield from exchange_steps(self.io, request, bridge)
        if ex.failure is not None:
            self._kill()
        exit_info = self._reported_exit()  # sometimes in already: then no wait at all
        if exit_info is None:  # on a loop, the zygote's reader wakes it: no thread waits for the report
            on_loop = functools.partial(self._reap_on_loop, grace_s=EXIT_GRACE_S) if self._zygote is not None else None
            exit_info = yield Blocking(functools.partial(self._reap, grace_s=EXIT_GRACE_S), on_loop=on_loop)
        return build_outcome(ex, exit_info, backend=self.backend, protections=self.protections, limits=self.limits)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def _reported_exit(self) -> ExitInfo | None:
        """The exit, if the zygote has reported it already (never waits); None otherwise."""
        if self._reaped or self._zygote is None:
            return None
        report = self._zygote.wait_exit(self.pid, 0.0)
        if report is None:
            return None
        self._reaped = True
        return _exit_info(int(report["status"]), float(report["cpu_time_s"]), int(report["maxrss_kb"]))

    def _reap(self, grace_s: float) -> ExitInfo:
        """Exit status plus host-measured CPU time and peak memory (of the runner and its pid-1 child)."""
        if self._reaped:
            return ExitInfo()
        status, cpu, maxrss_kb = self._wait(grace_s)
        if status is None:
            self._kill()
            status, cpu, maxrss_kb = self._wait(5.0)
        self._reaped = True
        if status is None:
            return ExitInfo()
        return _exit_info(status, cpu, maxrss_kb)

    async def _reap_on_loop(self, grace_s: float) -> ExitInfo:
        """:meth:`_reap` awaited on an event loop (the zygote's exit report wakes it)."""
        zygote = self._zygote
        if self._reaped or zygote is None:
            return ExitInfo()
        report = await zygote.exit_report(self.pid, grace_s)
        if report is None:
            self._kill()
            report = await zygote.exit_report(self.pid, 5.0)
        self._reaped = True
        if report is None:
            return ExitInfo()
        return _exit_info(int(report["status"]), float(report["cpu_time_s"]), int(report["maxrss_kb"]))

    def _wait(self, timeout: float) -> tuple[int | None, float, int]:
        if self._zygote is not None:
            report = self._zygote.wait_exit(self.pid, timeout)
            if report is None:
                return None, 0.0, 0
            return int(report["status"]), float(report["cpu_time_s"]), int(report["maxrss_kb"])
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None, 0.0, 0
            if pid:
                self.proc.returncode = status
                peak_kb = rusage.ru_maxrss if rusage.ru_maxrss > self._inherited_rss_kb else 0  # 0: not observed
                return status, rusage.ru_utime + rusage.ru_stime, peak_kb
            if time.monotonic() > deadline:
                return None, 0.0, 0
            time.sleep(0.0005)

    def kill(self) -> None:
        if not (self._destroyed or self._reaped):  # ended: its process id may be another's by now
            self._kill()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        if not self._reaped:  # reaped: its process id may be another's by now
            self._kill()
            self._reaped = True
            self._wait(2.0)
        self._close_fds()
        self._cleanup_dir()

    def _close_fds(self) -> None:
        self.io.close()
        held, self._held = self._held, []
        for fd in held:  # the last reference to the worker's namespaces: their teardown happens here
            with contextlib.suppress(OSError):
                os.close(fd)
        for fd in self._read_fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _cleanup_dir(self) -> None:
        if not self.owns_workdir:  # the backend's mount point: nothing was ever written there on the host
            return
        # Usually empty (the worker's files were in its own tmpfs, gone with it): one rmdir, not a tree walk.
        try:
            os.rmdir(self._workdir)  # noqa: PTH106
        except OSError:
            shutil.rmtree(self._workdir, ignore_errors=True)


def own_workdir(config: SandboxConfig) -> Path:
    """A fresh work directory, the sandbox user's (named after this process: reaped if it dies, leftovers.py)."""
    workdir = leftovers.new_workdir()
    if not rootless(config):
        os.chown(workdir, config.sandbox_uid, config.sandbox_gid)
    return workdir


def _exit_info(status: int, cpu: float, maxrss_kb: int) -> ExitInfo:
    """The exit as the host saw it; ``maxrss_kb`` 0 where the program's peak memory could not be observed."""
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else (code - 128 if code > 128 else None)
    usage = ResourceUsage(cpu_time_s=round(cpu, 6), peak_memory_mb=round(maxrss_kb / 1024, 3), source="host")
    return ExitInfo(exit_code=code if code >= 0 else None, signal=sig, usage=usage)


def rootless(config: SandboxConfig) -> bool:
    """Whether the walls must come from user namespaces: not root, or root of a user namespace in which the
    sandbox uid does not exist (the runner makes the same choice in ``lock_down``)."""
    return os.geteuid() != 0 or not _uid_mapped_here(config.sandbox_uid)


@functools.cache
def _uid_mapped_here(uid: int) -> bool:
    try:
        with open("/proc/self/uid_map") as fh:
            ranges = [[int(x) for x in line.split()] for line in fh if line.strip()]
    except (OSError, ValueError):
        return False
    return any(first <= uid < first + count for first, _, count in ranges)


def rootless_args(config: SandboxConfig) -> list[str]:
    """Runner arguments in rootless mode (see the runner's ``_reexec_in_user_namespace``)."""
    return ["--userns"] if rootless(config) else []


def boot_frame(
    config: SandboxConfig, limits: Limits, workdir: str | None, environment: MountedEnvironment | None = None
) -> BootFrame:
    """As root the runner drops to ``sandbox_uid``; without root that uid is its id inside its user namespace.
    An environment is bound read-only into the private root by the runner itself."""
    frame = boot.process_boot(
        limits,
        sys_path=[str(Path(RestrictedPython.__file__).resolve().parent.parent)],
        workdir=workdir,
        uid=config.sandbox_uid,
        gid=config.sandbox_gid,
    )
    if environment is not None:
        frame.environment = environment.boot(bind=True)
    return frame


#: The namespaces whose teardown (unmounting the private root, the network stack) a worker's exit would wait for.
HELD_NAMESPACES = ("mnt", "net", "ipc", "uts", "pid")


def _hold_namespaces(wpid: int) -> dict[str, int]:
    """Descriptors of the worker's namespaces, so that its exit is not the last reference to them.

    A process that holds the last reference to a mount or network namespace tears it down as it exits, before
    its parent can reap it: milliseconds under load (unmounting its private root most), during which the
    execution's outcome waited for the exit status. Held here, the namespaces (empty once the worker is gone:
    no process can enter them) outlive it until ``destroy`` closes them, after the outcome is returned
    (``Sandbox.execute`` destroys on a clean-up thread). Best effort: a namespace not opened is torn down
    at the exit, as before. By kind: the check of its namespaces reads them from these (``verify_protections``)."""
    held = {}
    for kind in HELD_NAMESPACES:
        with contextlib.suppress(OSError):
            held[kind] = os.open(f"/proc/{wpid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    return held


def _ended(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not reaped yet, or gone): its walls cannot be read any more."""
    state = verify.proc_status(pid).get("State")
    if state is None:
        return not os.path.exists(f"/proc/{pid}")  # noqa: PTH110 - only on a refusal
    return state[:1] in ("Z", "X")


def _worker_pid(pid: int) -> int:
    """The process that runs the program: the runner itself, or its pid-namespace child."""
    try:
        children = [int(c) for c in verify.read_proc(f"/proc/{pid}/task/{pid}/children").split()]
    except OSError:
        children = []
    return children[0] if children else pid


def verify_protections(
    pid: int, claimed: dict[str, bool], wpid: int | None = None, held: dict[str, int] | None = None
) -> dict[str, bool]:
    """Check from outside what the runner claims; a claim the host cannot confirm counts as absent.

    Namespaces are compared by their ``/proc/<pid>/ns`` links, the root by ``/proc/<pid>/root`` and the
    mount table the worker sees; a user is unprivileged when its uid is not 0 both as the host sees it and
    inside its own user namespace (rootless mode), and it holds no capability at all (with the bounding set
    emptied too where it held capabilities, as root or in its user namespace: one that never had any cannot
    drop it). ``wpid``: the program's process, if the caller has found it already (``_worker_pid``); ``held``: its
    namespaces, if the caller holds them open already (``_hold_namespaces``)."""
    wpid = _worker_pid(pid) if wpid is None else wpid
    status = verify.proc_status(wpid)
    verified = protections.unverified("subprocess")
    verified[P.SECCOMP] = claimed.get(P.SECCOMP, False) and verify.seccomp_filtered(status)
    verified[P.NO_NEW_PRIVS] = claimed.get(P.NO_NEW_PRIVS, False) and verify.no_new_privs(status)
    namespaces = verify.separate_namespaces(wpid, ("user", *verify.NAMESPACES), held)
    uids = verify.uids(status)
    inner = verify.inner_uids(wpid, uids) if namespaces["user"] else uids
    bounding = namespaces["user"] or os.geteuid() == 0
    cap_sets = ("Inh", "Prm", "Eff", "Amb", "Bnd") if bounding else ("Inh", "Prm", "Eff", "Amb")
    verified[P.UNPRIVILEGED_USER] = (
        claimed.get(P.UNPRIVILEGED_USER, False)
        and bool(uids)
        and all(u != "0" for u in (*uids, *inner))
        and verify.no_capabilities(status, cap_sets)
    )
    for kind, name in verify.NAMESPACES.items():
        verified[name] = claimed.get(name, False) and namespaces[kind]
    verified[P.PRIVATE_ROOT] = claimed.get(P.PRIVATE_ROOT, False) and namespaces["mnt"] and verify.tmpfs_root(wpid)
    verified[P.RLIMITS] = claimed.get(P.RLIMITS, False) and verify.rlimits_set(wpid)
    verified[P.AUDIT_TRIPWIRE] = claimed.get(P.AUDIT_TRIPWIRE, False)  # the runner's self-test; doctor's canary
    if P.USER_NAMESPACE in claimed or namespaces["user"]:
        verified[P.USER_NAMESPACE] = claimed.get(P.USER_NAMESPACE, False) and namespaces["user"]
    return verified


class SubprocessBackend:
    """Spawns workers from a per-limits zygote (fast path) or, when that is impossible, a fresh interpreter."""

    name = "subprocess"
    MAX_ZYGOTES = 4

    def __init__(self, config: SandboxConfig, *, runner: Path = RUNNER) -> None:
        self.config = config
        self.runner = runner
        self._zygotes: dict[Limits, Zygote] = {}
        self._lock = threading.Lock()
        self._mount_point: Path | None = None  # ``mount_point``
        #: zygotes that pre-imported an environment's modules (``sandbox/envzygotes.py``)
        #: why environment zygotes cannot be confined here (then there are none), or None
        self.env_zygotes_off = confinable(rootless(config))
        bound = 0 if self.env_zygotes_off else config.env_zygotes_max
        self.env_zygotes = EnvZygotes(self._env_zygote, bound=bound, idle_s=config.env_pool_idle_s)
        # What killed hosts left behind, of every backend: files now, the container engines at most once a
        # minute and a few seconds later (a one-shot `sandforge exec` is gone by then: sandbox/leftovers.py)
        leftovers.reap_in_background(containers=False)
        if leftovers.containers_due():
            leftovers.reap_containers_later()

    def prestart(self, limits: Limits) -> None:
        """Start the zygote of ``limits`` now without waiting for it, so its interpreter comes up beside the
        caller's own work (``sandforge exec``: its imports and the policy pass) instead of after it; the first
        spawn waits for its ready report. No thread: the caller's work never waits for the GIL behind a start.
        A zygote never runs a program: one started for a program the policy then refuses only costs its start,
        and ``close`` ends it like any other. A start that fails here is tried again, and reported, by the spawn."""
        if not self.config.zygote:
            return
        try:
            self._zygote(limits, wait=False)
        except Exception as exc:  # the spawn meets the same problem and reports it
            log.debug("zygote prestart failed: %s", exc)

    def spawn(self, limits: Limits, environment: MountedEnvironment | None = None) -> SubprocessWorker:
        zygote = self._zygote_for(limits, environment) if self.config.zygote else None
        mount_point = self.mount_point()
        try:
            return SubprocessWorker(self.config, limits, self.runner, zygote, environment, mount_point)
        except SandboxUnavailable:
            if zygote is None or zygote.alive():
                raise
            log.warning("zygote died; starting the worker directly")
            return SubprocessWorker(self.config, limits, self.runner, None, environment, mount_point)

    def mount_point(self) -> Path | None:
        """The one directory every worker of this backend mounts its private root on, when a private root is
        enforced (else None: each worker has a work directory of its own, its files in it).

        A runner mounts its tmpfs there in a mount namespace of its own (its mounts private), so no other
        process, the host's included, sees what it holds, and nothing is ever written into the directory
        itself: a worker without that root is refused before it is handed any code. One directory for all
        saves each worker's start a ``mkdir`` and ``chown`` and its end an ``rmdir`` (on a busy disk's
        journal, the dearest system calls of the host's share: ~8% of its CPU per execution)."""
        if P.PRIVATE_ROOT not in self.config.enforced_protections:
            return None
        with self._lock:
            if self._mount_point is None:
                self._mount_point = own_workdir(self.config)
            return self._mount_point

    def _zygote_for(self, limits: Limits, environment: MountedEnvironment | None) -> Zygote | None:
        """The environment's own zygote (its modules imported) when one can be had, else the plain one. The
        tests' seam reverts layers in each runner, which a zygote's import would already have applied."""
        if environment is not None and seam.ACTIVE is None:
            found = self.env_zygotes.get(limits, environment)
            if found is not None:
                return found
        return self._zygote(limits)

    def _env_zygote(self, limits: Limits, environment: MountedEnvironment) -> Zygote:
        """Start a zygote that confines itself, then imports ``environment``'s modules before it forks (raises
        ZygoteError)."""
        boot = boot_frame(self.config, limits, None).model_dump(mode="json")
        boot["preload"] = environment.boot(bind=True).model_dump()
        return ConfinedZygote(
            self.config.python or sys.executable, self.runner, boot,
            start_timeout=max(self.config.spawn_timeout_s, ENV_ZYGOTE_START_S), extra_args=rootless_args(self.config),
        )  # fmt: skip

    def _zygote(self, limits: Limits, *, wait: bool = True) -> Zygote | None:
        with self._lock:
            zygote = self._zygotes.get(limits)
            if zygote is not None and zygote.running():
                return self._ready(limits, zygote) if wait else zygote
            if zygote is not None:
                zygote.close()
            if len(self._zygotes) >= self.MAX_ZYGOTES:
                oldest = next(iter(self._zygotes))
                self._zygotes.pop(oldest).close()
            python = self.config.python or sys.executable
            boot = boot_frame(self.config, limits, None).model_dump(mode="json")
            try:
                zygote = Zygote(
                    python,
                    self.runner,
                    boot,
                    start_timeout=self.config.spawn_timeout_s,
                    extra_args=rootless_args(self.config),
                    wait_ready=wait,
                )
            except ZygoteError as exc:
                log.warning("zygote unavailable, falling back to one interpreter per worker: %s", exc)
                self._zygotes.pop(limits, None)
                return None
            self._zygotes[limits] = zygote
            return zygote

    def _ready(self, limits: Limits, zygote: Zygote) -> Zygote | None:
        """``zygote`` once it reported ready (a prestarted one may still be starting), or None like a start that
        failed: one interpreter per worker for this spawn, a new zygote tried by the next (under the lock)."""
        try:
            zygote.await_ready()
        except ZygoteError as exc:
            log.warning("zygote unavailable, falling back to one interpreter per worker: %s", exc)
            self._zygotes.pop(limits, None)
            return None
        return zygote

    def close(self) -> None:
        self.env_zygotes.close()
        with self._lock:
            zygotes, self._zygotes = list(self._zygotes.values()), {}
        for zygote in zygotes:
            zygote.close()
        with self._lock:
            mount_point, self._mount_point = self._mount_point, None
        if mount_point is not None:  # a worker still running keeps its own mount of it, not the directory
            with contextlib.suppress(OSError):
                os.rmdir(mount_point)  # noqa: PTH106
