"""The zygote: a pristine, pre-imported template that forks one fresh runner per execution and never runs a
program itself (its host side is ``sandbox/zygote.py``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from . import confine, preload, tripwire
from .lazycontext import encode
from .serving import prepare, serve
from .wire import MAX_BOOT_BYTES

CHILD_RESULT_FD = 3


def _send(sock: Any, message: dict[str, Any]) -> None:
    sock.send(encode(message))


def _spawn_child(
    sock: Any, boot: dict[str, Any], proxies: dict[str, Any], request: dict[str, Any], fds: list[int]
) -> int:
    """Fork a runner whose stdin, stdout, stderr and result channel are the four descriptors received (a
    confined zygote clones it straight into namespaces of its own: ``confine.clone_runner``)."""
    pid = confine.clone_runner() if boot.get("confined") else os.fork()
    if pid:
        return pid
    status = 70
    try:
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
    try:
        return _zygote_loop(sock, boot, proxies, wake_r, children)
    finally:
        for child in children:  # the host hung up (it died or closed us): nothing may outlive it
            with contextlib.suppress(OSError):
                os.killpg(child, signal.SIGKILL)


def _zygote_loop(sock: Any, boot: dict[str, Any], proxies: dict[str, Any], wake_r: int, children: set[int]) -> int:
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            children.discard(pid)
            _send(sock, {"op": "exited", "pid": pid, "status": status, "cpu_time_s": usage.ru_utime + usage.ru_stime,
                         "maxrss_kb": usage.ru_maxrss})  # fmt: skip
        if sock.fileno() in readable:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
            if not message:
                return 0
            request = json.loads(message)
            try:
                if len(fds) != 4:
                    raise ValueError("a spawn request carries exactly four descriptors")
                preload.check_spawn(request.get("environment"))
                pid = _spawn_child(sock, boot, proxies, request, fds)
                children.add(pid)
                _send(sock, {"op": "spawned", "id": request.get("id"), "pid": pid})
            except (OSError, ValueError) as exc:
                _send(sock, {"op": "failed", "id": request.get("id"), "error": str(exc)})
            finally:
                for fd in fds:
                    os.close(fd)
