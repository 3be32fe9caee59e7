"""The zygote: a pristine, pre-imported template that forks one fresh runner per execution and never runs a
program itself (its host side is ``sandbox/zygote.py``)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from . import confine, envmodules, preload, tripwire, world
from .lazycontext import encode
from .lockdown import PR_SET_PDEATHSIG, clone_runner
from .serving import prepare, serve
from .wire import MAX_BOOT_BYTES

CHILD_RESULT_FD = 3
#: Whether the last runner was cloned pid 1 of its own pid namespace (not forked: ``clone_runner`` refused).
_CLONED: list[bool] = [False]


def _send(sock: Any, message: dict[str, Any]) -> None:
    sock.send(encode(message))


def _spawn_child(
    sock: Any, boot: dict[str, Any], proxies: dict[str, Any], request: dict[str, Any], fds: list[int]
) -> tuple[int, bool]:
    """Fork a runner whose stdin, stdout, stderr and result channel are the four descriptors received; its
    pid, and whether it is the host's child (``adopt`` asked and granted) rather than this zygote's.

    A confined zygote clones it straight into namespaces of its own (``clone_runner`` with every namespace).
    Otherwise the runner is born pid 1 of its own pid namespace where the kernel allows it: then it is the
    only process of the sandbox. Adopted, the host reaps it (its exit status and usage straight from the
    kernel, no report from here); otherwise this zygote does and reports, and the runner dies with it (its
    parent-death signal: not for an adopted one, whose parent is a host *thread*). Either way the zygote kills
    it when the host hangs up. Where the clone is refused the runner forks once more in its lock-down, as a
    runner started directly does."""
    confined = bool(boot.get("confined"))
    adopt = request.get("adopt") is True and not confined
    pid = clone_runner(confine.RUNNER_NAMESPACES if confined else 0, adopted=adopt, required=confined)
    _CLONED[:] = [pid > 0]
    if pid < 0:
        adopt, pid = False, os.fork()
    if pid:
        return pid, adopt
    status = 70
    try:
        if os.getpid() == 1 and not adopt and not confined:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        if boot.get("confined"):
            _confined_child()
            request = {**request, "workdir": confine.RUNNER_ROOT, "entered": boot["confined"]}
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(CHILD_RESULT_FD + 1, 65536)
        child_boot = {**boot, "workdir": request.get("workdir"), "environment": request.get("environment"),
                      "entered": request.get("entered")}  # fmt: skip
        status = serve(0, CHILD_RESULT_FD, child_boot, proxies)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _confined_child() -> None:
    """A confined zygote's runner: it dies with the zygote (which may not signal it), and is dumpable until its
    lock-down, which writes its own id maps through ``/proc/self`` (the lock-down clears the flag again). It
    was cloned into its namespaces (``entered``: the zygote's ids, which it maps its own to)."""
    from .lockdown import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, _libc

    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _preload(boot: dict[str, Any], ahead: Any) -> dict[str, Any]:
    """Confine this zygote (when the host asks: ``confine.py``), then import the environment's modules with the
    tripwire installed, as a fresh runner has it when a program imports them; what ``ready`` reports."""
    if not isinstance(boot.get("confine"), dict):
        preload.preload(ahead)
        return {}
    site = ahead.get("bind_source") if isinstance(ahead, dict) else None
    if not isinstance(site, str):
        raise preload.PreloadFailed("the environment to pre-import names no site")
    armed = tripwire.install()
    walls = confine.confine(boot, os.path.normpath(site))
    preload.preload(ahead)
    left = confine.strays()
    if left:
        raise preload.PreloadFailed(f"importing left {len(left)} process(es) running: {left[:8]}")
    boot["confined"], boot["tripwire_installed"] = [os.geteuid(), os.getegid()], armed
    return {"walls": walls, "tripwire": armed}


def zygote(control_fd: int) -> int:
    """Serve spawn requests on a SEQPACKET control socket; report each child's exit and resource usage.

    The zygote never runs a program: it only forks. Each child performs the full lock-down itself, exactly
    like a freshly started runner, so a child is as fresh as a new process but costs a fork, not a start.
    """
    sock = socket.socket(fileno=control_fd)
    boot = json.loads(sock.recv(MAX_BOOT_BYTES))
    proxies = prepare(boot)
    if boot.get("chroot"):  # what its runners bind into their roots: read once here, inherited by each fork
        envmodules.library_dirs()
    ahead = boot.pop("preload", None)  # an environment zygote (``preload``): its modules, imported once here
    confined: dict[str, Any] = {}
    if ahead is not None:
        try:
            confined = _preload(boot, ahead)
        except (preload.PreloadFailed, confine.ConfineFailed, OSError) as exc:
            _send(sock, {"op": "failed", "error": str(exc)})
            while sock.recv(1 << 16):  # alive until the host hangs up: it ends what the import left first
                pass
            return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"op": "ready", "pid": os.getpid(), **confined})
    children: set[int] = set()
    adopted: dict[int, int] = {}  # pidfd -> pid of each running runner the host reaps
    try:
        return _zygote_loop(sock, boot, proxies, wake_r, children, adopted)
    finally:
        for child in children:  # the host hung up (it died or closed us): nothing may outlive it
            with contextlib.suppress(OSError):
                os.killpg(child, signal.SIGKILL)
        for pidfd in adopted:  # by pidfd: the host may have reaped one, and its pid be another's now
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def _adopt(pid: int, adopted: dict[int, int], children: set[int]) -> None:
    """Keep a pidfd of a runner the host reaps, to kill it if the host hangs up (never a reused pid). Not
    watched: its end does not wake this zygote; the pidfds of the ended ones are closed at the next spawn."""
    _prune(adopted)
    try:
        adopted[os.pidfd_open(pid)] = pid
    except OSError:  # cannot be: it is not reaped before the host hears of it; by pid then, as before
        children.add(pid)


def _prune(adopted: dict[int, int]) -> None:
    """Close the pidfds of the adopted runners that ended (readable: no wait)."""
    if not adopted:
        return
    poller = select.poll()
    for pidfd in adopted:
        poller.register(pidfd, select.POLLIN)
    for pidfd, _ in poller.poll(0):
        adopted.pop(pidfd, None)
        os.close(pidfd)


def _report_exits(sock: Any, children: set[int]) -> None:
    """Reap the runners that are this zygote's own children and ended; report each one's exit and usage."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        children.discard(pid)
        _send(sock, {"op": "exited", "pid": pid, "status": status, "cpu_time_s": usage.ru_utime + usage.ru_stime,
                     "maxrss_kb": usage.ru_maxrss})  # fmt: skip


def _zygote_loop(
    sock: Any, boot: dict[str, Any], proxies: dict[str, Any], wake_r: int, children: set[int], adopted: dict[int, int]
) -> int:
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _report_exits(sock, children)
        if sock.fileno() in readable:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
            if not message:
                return 0
            request = json.loads(message)
            try:
                if len(fds) != 4:
                    raise ValueError("a spawn request carries exactly four descriptors")
                preload.check_spawn(request.get("environment"))
                world.plan_forgetting()  # once (again only if this zygote imported since): not in every runner
                pid, host_reaps = _spawn_child(sock, boot, proxies, request, fds)
                if host_reaps:
                    _adopt(pid, adopted, children)
                else:
                    children.add(pid)
                # pid1: cloned pid 1 of its own pid namespace (``clone_runner``), so its lock-down forks no child
                # and the process the host checks is this one
                _send(sock, {"op": "spawned", "id": request.get("id"), "pid": pid, "adopted": host_reaps,
                             "pid1": _CLONED[-1]})  # fmt: skip
            except (OSError, ValueError) as exc:
                _send(sock, {"op": "failed", "id": request.get("id"), "error": str(exc)})
            finally:
                for fd in fds:
                    os.close(fd)
