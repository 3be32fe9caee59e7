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

from . import preload
from .lazycontext import encode
from .lockdown import PR_SET_PDEATHSIG, fork_as_pid1
from .serving import prepare, serve
from .wire import MAX_BOOT_BYTES

CHILD_RESULT_FD = 3


def _send(sock: Any, message: dict[str, Any]) -> None:
    sock.send(encode(message))


def _spawn_child(
    sock: Any, boot: dict[str, Any], proxies: dict[str, Any], request: dict[str, Any], fds: list[int]
) -> int:
    """Fork a runner whose stdin, stdout, stderr and result channel are the four descriptors received.

    The runner is born pid 1 of its own pid namespace where the kernel allows it (``fork_as_pid1``): then it is
    the only process of the sandbox, its exit the one reaped here, and it dies with the zygote (its parent-death
    signal; the zygote kills its children when the host hangs up). Elsewhere it forks once more in its
    lock-down, as a runner started directly does."""
    pid = fork_as_pid1()
    if pid < 0:
        pid = os.fork()
    if pid:
        return pid
    status = 70
    try:
        if os.getpid() == 1:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(CHILD_RESULT_FD + 1, 65536)
        child_boot = {**boot, "workdir": request.get("workdir"), "environment": request.get("environment")}
        status = serve(0, CHILD_RESULT_FD, child_boot, proxies)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(status)


def zygote(control_fd: int) -> int:
    """Serve spawn requests on a SEQPACKET control socket; report each child's exit and resource usage.

    The zygote never runs a program: it only forks. Each child performs the full lock-down itself, exactly
    like a freshly started runner, so a child is as fresh as a new process but costs a fork, not a start.
    """
    sock = socket.socket(fileno=control_fd)
    boot = json.loads(sock.recv(MAX_BOOT_BYTES))
    proxies = prepare(boot)
    ahead = boot.pop("preload", None)  # an environment zygote (``preload``): its modules, imported once here
    if ahead is not None:
        try:
            preload.preload(ahead)
        except (preload.PreloadFailed, OSError) as exc:
            _send(sock, {"op": "failed", "error": str(exc)})
            return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"op": "ready", "pid": os.getpid()})
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
