"""Host side of the runner's zygote mode: fork fresh runners from a pristine, pre-imported template.

Starting an interpreter and importing RestrictedPython costs tens of times more CPU than forking a process
that already did (docs/benchmarks.md, "Numbers behind the code"). The zygote never runs a program. Each forked
child performs the complete lock-down itself (namespaces, private root, privilege drop, rlimits, seccomp) and
serves exactly one execution. The zygote reaps its children and reports their exit status and resource usage
here, so the numbers stay host-measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
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


#: How long a closed zygote gets to end its children itself before the host kills them and it.
HANG_UP_GRACE_S = 2.0


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
        return not self._closed and self.proc.poll() is None

    def spawn(
        self, workdir: str, fds: list[int], environment: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> int:
        """Fork a runner wired to ``fds`` (stdin, stdout, stderr, result channel), with ``environment`` (the
        boot frame's part) bound into its private root; returns its pid."""
        request_id = next(self._ids)
        spawn: dict[str, Any] = {"op": "spawn", "id": request_id, "workdir": workdir}
        if environment is not None:
            spawn["environment"] = environment
        message = json.dumps(spawn).encode()
        with self._send_lock:
            socket.send_fds(self._sock, [message], fds)
        deadline = time.monotonic() + timeout
        with self._cond:
            while request_id not in self._replies:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive():
                    raise ZygoteError("zygote did not answer a spawn request")
                self._cond.wait(min(remaining, 0.5))
            reply = self._replies.pop(request_id)
            if reply.get("op") == "spawned" and int(reply["pid"]) not in self._exits:
                self._children.add(int(reply["pid"]))
        if reply.get("op") != "spawned":
            raise ZygoteError(f"zygote could not spawn: {reply.get('error')}")
        return int(reply["pid"])

    def wait_exit(self, pid: int, timeout: float) -> dict[str, Any] | None:
        """The exit report of a child (status, cpu_time_s, maxrss_kb), or None if none came in time."""
        deadline = time.monotonic() + timeout
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
                self._watchers[pid] = wake
        # a plain timer, not ``wait_for``: the report resumes this task in the loop iteration that got it
        timer = loop.call_later(timeout, settle)
        try:
            await arrived
        finally:
            timer.cancel()
            with self._cond:
                self._watchers.pop(pid, None)
        return self.wait_exit(pid, 0.0)

    def _read_loop(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                log.error("zygote sent a malformed message")
                break
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
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            watcher()

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
