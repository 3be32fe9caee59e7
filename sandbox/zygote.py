"""Host side of the runner's zygote mode: fork fresh runners from a pristine, pre-imported template.

Starting an interpreter and importing RestrictedPython costs tens of times more CPU than forking a process
that already did (docs/benchmarks.md, "Numbers behind the code"). The zygote never runs a program. Each forked
child performs the complete lock-down itself (namespaces, private root, privilege drop, rlimits, seccomp) and
serves exactly one execution. The zygote reaps its children and reports their exit status and resource usage
here, so the numbers stay host-measured.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ZygoteError(Exception):
    pass


def can_adopt() -> bool:
    """Whether this process can be the parent of the zygote's runners (see :meth:`Zygote.spawn`)."""
    return hasattr(os, "pidfd_open") and signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN


#: How long a closed zygote gets to end its children itself before the host kills them and it.
HANG_UP_GRACE_S = 2.0
#: The longest single wait on an adopted runner's pidfd (``wait_exit``): ``close`` may end it meanwhile.
ADOPTED_POLL_S = 0.25


def wait_fd(fd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until ``fd`` is readable (a pidfd: its process ended); True when it is."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


class Zygote:
    def __init__(
        self,
        python: str,
        runner: Path,
        boot: dict[str, Any],
        *,
        start_timeout: float = 20.0,
        extra_args: list[str] | None = None,
        wait_ready: bool = True,
    ) -> None:
        """Start the zygote and send it ``boot``; with ``wait_ready`` (the default) wait for its ready report,
        else leave that to :meth:`await_ready` (a prestart: the interpreter comes up while the caller works)."""
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-I", "-S", "-B", str(runner), "--zygote", "--control-fd", str(child.fileno())]
        try:
            self.proc = subprocess.Popen(
                [*argv, *(extra_args or [])],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={},
                close_fds=True,
                pass_fds=(child.fileno(),),
                start_new_session=True,
            )
        finally:
            child.close()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, dict[str, Any]] = {}
        #: pid -> called (on the reader thread) when its exit report arrives or the zygote goes away
        self._watchers: dict[int, Callable[[], None]] = {}
        #: children spawned and not reported exited: killed by the host if the zygote cannot end them (``close``)
        self._children: set[int] = set()
        #: pid -> pidfd of the runners that are this process's own children (adopted): reaped by whoever waits for
        #: their exit (``wait_exit`` polls the pidfd, ``exit_report`` has the event loop watch it), not reported
        self._adopted: dict[int, int] = {}
        #: runners cloned pid 1 of their own pid namespace (``born_pid1``)
        self._pid1: set[int] = set()
        self._send_lock = threading.Lock()
        self._closed = False
        self._ready_by = time.monotonic() + start_timeout
        self._ready = False
        self._sock.settimeout(start_timeout)
        try:
            self._sock.send(json.dumps(boot).encode())
        except OSError as exc:
            self.close()
            raise ZygoteError(f"zygote did not start: {exc}") from exc
        if wait_ready:
            self.await_ready()

    def await_ready(self) -> None:
        """Wait (until the start timeout, counted from the start) for the ready report; raises ZygoteError, the
        zygote closed, when none comes. Callers serialise it (the backend's lock); a ready zygote returns."""
        if self._ready:
            return
        try:
            self._sock.settimeout(max(self._ready_by - time.monotonic(), 0.001))
            ready = json.loads(self._sock.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            self.close()
            raise ZygoteError(f"zygote did not start: {exc}") from exc
        if ready.get("op") != "ready":
            self.close()
            raise ZygoteError(f"zygote did not report ready: {ready.get('error') or 'no reason given'}")
        self._sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name="sandforge-zygote", daemon=True)
        self._reader.start()
        self._ready = True

    def alive(self) -> bool:
        """Running: once ready, as long as its control socket is open (the reader sees it close when the zygote
        ends: no system call here, several times per execution); before, as its process says."""
        if self._ready:
            return not self._closed
        return self.running()

    def running(self) -> bool:
        """Not closed, and its process not ended: asked once per spawn, where a zygote killed a moment ago (its
        hang-up not seen by the reader yet) must not be handed the next runner."""
        return not self._closed and self.proc.poll() is None

    def spawn(
        self, workdir: str, fds: list[int], environment: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> int:
        """Fork a runner wired to ``fds`` (stdin, stdout, stderr, result channel), with ``environment`` (the
        boot frame's part) bound into its private root; returns its pid.

        Where this process can reap (it does not ignore SIGCHLD, and has ``pidfd_open``) the runner is its own
        child (``adopt``: the zygote clones it with ``CLONE_PARENT``): its exit status and usage come from the
        kernel here (``wait4``), as soon as it ends, with no zygote to wake and no report to relay. The exit
        reports (:meth:`wait_exit`, :meth:`exit_report`) are the same either way."""
        request_id = next(self._ids)
        spawn: dict[str, Any] = {"op": "spawn", "id": request_id, "workdir": workdir, "adopt": can_adopt()}
        if environment is not None:
            spawn["environment"] = environment
        message = json.dumps(spawn).encode()
        with self._send_lock:
            try:
                socket.send_fds(self._sock, [message], fds)
            except OSError as exc:  # it hung up (killed, or ended): gone for every later spawn too
                self._closed = True
                raise ZygoteError(f"zygote is gone: {exc}") from exc
        deadline = time.monotonic() + timeout
        with self._cond:
            while request_id not in self._replies:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive():
                    raise ZygoteError("zygote did not answer a spawn request")
                self._cond.wait(min(remaining, 0.5))
            reply = self._replies.pop(request_id)
            if reply.get("op") == "spawned" and reply.get("adopted") is True:
                self._adopt(int(reply["pid"]))
            if reply.get("op") == "spawned" and int(reply["pid"]) not in self._exits:
                self._children.add(int(reply["pid"]))
            if reply.get("op") == "spawned" and reply.get("pid1") is True:
                self._pid1.add(int(reply["pid"]))
        if reply.get("op") != "spawned":
            raise ZygoteError(f"zygote could not spawn: {reply.get('error')}")
        return int(reply["pid"])

    def born_pid1(self, pid: int) -> bool:
        """Whether the runner ``pid`` was cloned pid 1 of its own pid namespace (asked once, after its spawn): then
        it is the process that runs the program, with no pid-1 child of its own to look for."""
        with self._cond:
            if pid in self._pid1:
                self._pid1.discard(pid)
                return True
        return False

    def _adopt(self, pid: int) -> None:
        """Keep a pidfd of an adopted runner (under ``_cond``): its exit wakes whoever waits for it, with no
        thread in between."""
        try:
            self._adopted[pid] = os.pidfd_open(pid)
        except OSError as exc:  # cannot be for our own unreaped child; never leave it unwatched
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            raise ZygoteError(f"cannot watch the runner: {exc}") from exc

    def _reap_adopted(self, pid: int) -> int | None:
        """Reap an adopted runner if it has ended (never waits): its exit report, as the zygote would send it.
        The pidfd of one still running (to wait on), else None."""
        with self._cond:
            pidfd = self._adopted.get(pid)
            if pidfd is None or self._closed:
                return None
            try:
                got, status, usage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored since): no status to report
                got, status, usage = -1, 0, None
            if not got:
                return pidfd
            del self._adopted[pid]
            os.close(pidfd)
            self._children.discard(pid)
            self._pid1.discard(pid)
            if usage is not None:
                cpu = usage.ru_utime + usage.ru_stime
                self._exits[pid] = {"op": "exited", "pid": pid, "status": status, "cpu_time_s": cpu,
                                    "maxrss_kb": usage.ru_maxrss}  # fmt: skip
            self._cond.notify_all()
        return None

    def wait_exit(self, pid: int, timeout: float) -> dict[str, Any] | None:
        """The exit report of a child (status, cpu_time_s, maxrss_kb), or None if none came in time. An adopted
        runner's exit wakes this thread itself (its pidfd), which then reaps it."""
        deadline = time.monotonic() + timeout
        while (pidfd := self._reap_adopted(pid)) is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.alive():
                return None
            # In slices: a pidfd closed meanwhile (``close``) and its number reused is looked up again.
            wait_fd(pidfd, min(remaining, ADOPTED_POLL_S))
        with self._cond:
            while pid not in self._exits:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive():
                    return None
                self._cond.wait(remaining)
            return self._exits.pop(pid)

    async def exit_report(self, pid: int, timeout: float) -> dict[str, Any] | None:
        """:meth:`wait_exit` for an event loop: the reader thread wakes the loop when the report arrives, so no
        thread waits for it (an awaited execution's last step: ``AsyncSandbox``)."""
        report = self.wait_exit(pid, 0.0)
        if report is not None or not self.alive():
            return report
        import asyncio  # the async API's (``AsyncSandbox``): loaded with it

        loop = asyncio.get_running_loop()
        arrived = loop.create_future()

        def settle() -> None:
            if not arrived.done():
                arrived.set_result(None)

        def wake() -> None:  # on the reader thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle)

        with self._cond:
            if pid in self._exits or self._closed:
                settle()
            else:
                self._watchers[pid] = wake  # a report, or the zygote gone
            pidfd = self._adopted.get(pid)
        if pidfd is not None:  # an adopted runner: the loop itself watches for its end
            loop.add_reader(pidfd, settle)
        # a plain timer, not ``wait_for``: the report resumes this task in the loop iteration that got it
        timer = loop.call_later(timeout, settle)
        try:
            await arrived
        finally:
            timer.cancel()
            if pidfd is not None:
                loop.remove_reader(pidfd)
            with self._cond:
                self._watchers.pop(pid, None)
        return self.wait_exit(pid, 0.0)

    def _read_loop(self) -> None:
        while self._receive():
            pass
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            watcher()

    def _receive(self) -> bool:
        """One message from the zygote (a spawn's answer, an exit report); False when it hung up."""
        try:
            data = self._sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return False
        try:
            message = json.loads(data)
        except ValueError:
            log.error("zygote sent a malformed message")
            return False
        watcher = None
        with self._cond:
            if message.get("op") == "exited":
                self._exits[int(message["pid"])] = message
                self._children.discard(int(message["pid"]))
                watcher = self._watchers.pop(int(message["pid"]), None)
            else:
                self._replies[int(message.get("id", -1))] = message
            self._cond.notify_all()
        if watcher is not None:
            watcher()
        return True

    def close(self) -> None:
        """End the zygote and every child of it still running (a zygote evicted while its children run takes
        them with it). Its children are in sessions of their own, so a kill of the zygote's group alone would
        orphan them, running: the host hangs up first, and the zygote kills its children when it sees that.
        One that does not end within ``HANG_UP_GRACE_S`` is killed with the children the host knows of (its
        own, still: unreaped while it lives, so their ids are not another process's)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=HANG_UP_GRACE_S)
        except subprocess.TimeoutExpired:
            with self._cond:
                children = list(self._children)
            for pid in children:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        self._end_adopted()

    def _end_adopted(self) -> None:
        """Kill and reap the adopted runners still here (the zygote killed them too, when it saw the hang-up):
        they are this process's children, and no report of them is wanted any more."""
        with self._cond:
            adopted, self._adopted = self._adopted, {}
        for pid, pidfd in adopted.items():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            wait_fd(pidfd, 5.0)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            os.close(pidfd)
