"""What an awaited call carries to the sync code that runs for it: its loop and its cancellation scope.

The async API (``runtime/agent/aio.py``, ``runtime/sessions/aio.py``) runs the one sync implementation (the
lifecycle, a chat turn) on a thread (:func:`run_awaited`), in a context whose :data:`CURRENT` scope names the
event loop: every workspace call made there sends its executions to that loop (:func:`awaited_port`:
``AsyncSandbox``, no thread waits on a sandbox). When the awaiting task is cancelled, :meth:`CallScope.cancel`
cancels the executions in flight (their workers are killed and cleaned up as after a timeout) and every later
execution of the call, nested ones included, raises :class:`CallCancelled` before it starts. That exception
is a ``BaseException``: no ``except Exception`` of the lifecycle turns it into an outcome, so the call
unwinds with nothing committed.
The commit itself is a window (:func:`commit_window`): once a scope is cancelled, no commit of its call
starts; a commit already in progress finishes first (the cancellation came too late for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Executor, Future
from contextvars import ContextVar
from typing import TypeVar

from sandforge.sandbox import AsyncSandbox, BridgeHandler, ExecutionOutcome, ExecutionRequest, Sandbox
from sandforge.sandbox.aio import Threads
from sandforge.sandbox.config import BackendName, SandboxConfig
from sandforge.sandbox.environment import Interpreter

T = TypeVar("T")


class CallCancelled(BaseException):
    """The task awaiting this call was cancelled: stop, commit nothing (not an Exception on purpose)."""


class CallsClosed(RuntimeError):
    """The async workspace or session was closed: it starts no new call."""


class CallScope:
    """One awaited call: its loop and threads, whether it was cancelled, how to cancel what it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: Threads) -> None:
        self.loop = loop
        self.threads = threads
        self._lock = threading.Lock()
        self.cancelled = False
        #: a commit of this call finished before the cancellation (it stays: it came too late to stop it)
        self.committed = False
        self._running: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._ports: dict[int, LoopSandbox] = {}

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            running, self._running = list(self._running.values()), {}
        for cancel in running:
            cancel()

    def check(self) -> None:
        if self.cancelled:
            raise CallCancelled

    def port(self, sandbox: Sandbox) -> LoopSandbox:
        """``sandbox``'s executions awaited on this scope's loop (its pools and backends, shared)."""
        with self._lock:
            port = self._ports.get(id(sandbox))
            if port is None:
                port = self._ports[id(sandbox)] = LoopSandbox(AsyncSandbox(sandbox, threads=self.threads), self)
            return port

    @contextlib.contextmanager
    def tracking(self, cancel: Callable[[], None]) -> Iterator[None]:
        """While an execution runs, a cancellation calls ``cancel`` (which ends it)."""
        key = next(self._ids)
        with self._lock:
            late = self.cancelled
            if not late:
                self._running[key] = cancel
        if late:
            cancel()
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(key, None)

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        with self._lock:
            if self.cancelled:
                raise CallCancelled
            yield
            self.committed = True


class InFlight:
    """The awaited calls of one owner (an ``AsyncWorkspace``, an ``AsyncSession``). Closing the owner cancels
    them as cancelling their tasks would (their executions end, nothing is committed), so a close never waits
    for a running program to reach its own time limit; and no call starts after the close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: set[CallScope] = set()
        self.closed = False

    def add(self, scope: CallScope) -> None:
        with self._lock:
            if self.closed:
                raise CallsClosed("this async workspace (or session) is closed")
            self._scopes.add(scope)

    def discard(self, scope: CallScope) -> None:
        with self._lock:
            self._scopes.discard(scope)

    def close(self) -> None:
        """No new call; the running ones are cancelled (their tasks get CancelledError once they unwound)."""
        with self._lock:
            self.closed = True
            scopes = list(self._scopes)
        for scope in scopes:
            scope.cancel()


#: The scope of the awaited call this thread works for (None: a plain sync call).
CURRENT: ContextVar[CallScope | None] = ContextVar("sandforge_call_scope", default=None)


@contextlib.contextmanager
def commit_window() -> Iterator[None]:
    """Around a top-level commit: refused (CallCancelled) once the awaiting task was cancelled."""
    scope = CURRENT.get()
    if scope is None:
        yield
        return
    with scope.committing():
        yield


def awaited_port(sandbox: Sandbox) -> LoopSandbox | None:
    """Where a workspace call on this thread runs its executions: on the awaiting call's loop, or None (a
    plain sync call: on the workspace's sandbox, blocking)."""
    scope = CURRENT.get()
    return None if scope is None else scope.port(sandbox)


class LoopSandbox:
    """The sandbox port of an awaited call: each execution, asked for on the call's thread, is awaited on the
    event loop (``AsyncSandbox.execute``) and tracked by the call's scope, so cancelling the call ends it."""

    def __init__(self, sandbox: AsyncSandbox, scope: CallScope) -> None:
        self._sandbox = sandbox
        self._scope = scope

    @property
    def config(self) -> SandboxConfig:
        return self._sandbox.config

    def interpreter(self, backend: BackendName | None = None) -> Interpreter:
        return self._sandbox.sandbox.interpreter(backend)

    def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome:
        """Awaits the execution on the loop from the call's thread. Cancelled, it returns only once the
        execution's worker is cleaned up, raising CallCancelled."""
        scope, loop = self._scope, self._scope.loop
        scope.check()
        done: Future[ExecutionOutcome] = Future()
        started: list[asyncio.Task[ExecutionOutcome]] = []

        def start() -> None:  # on the loop, in this thread's context (the scope reaches nested calls)
            task = loop.create_task(self._sandbox.execute(request, backend=backend, bridge=bridge))
            started.append(task)
            task.add_done_callback(functools.partial(_settle, done))

        def cancel() -> None:  # the task itself, so ``done`` settles only after its clean-up
            loop.call_soon_threadsafe(lambda: started[0].cancel() if started else None)

        loop.call_soon_threadsafe(start)
        try:
            with scope.tracking(cancel):
                return done.result()
        except FutureCancelled:
            raise CallCancelled from None


def _settle(done: Future[ExecutionOutcome], task: asyncio.Task[ExecutionOutcome]) -> None:
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


async def run_awaited(fn: Callable[[], T], *, thread: Executor, threads: Threads, calls: InFlight | None = None) -> T:
    """``fn()`` (sync code: a workspace call, a chat turn) on ``thread``, awaited: its executions run on this
    loop, and cancelling the awaiting task cancels them, stops the rest and waits until ``fn`` has unwound
    (nothing of it runs on) before ``CancelledError`` is raised. A call cancelled by its owner's close
    (``calls``) ends the same way: ``CancelledError``."""
    loop = asyncio.get_running_loop()
    scope = CallScope(loop, threads)
    if calls is not None:
        calls.add(scope)
    try:
        return await _awaited(fn, scope, loop, thread)
    finally:
        if calls is not None:
            calls.discard(scope)


async def _awaited(fn: Callable[[], T], scope: CallScope, loop: asyncio.AbstractEventLoop, thread: Executor) -> T:
    context = contextvars.copy_context()
    context.run(CURRENT.set, scope)
    running = loop.run_in_executor(thread, context.run, fn)
    try:
        return await asyncio.shield(running)
    except CallCancelled:  # cancelled by the owner's close, not by this task: as an awaited future cancelled
        raise asyncio.CancelledError from None
    except asyncio.CancelledError:
        scope.cancel()
        while not running.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([running])  # never raises what fn raised, never cancels it
        if not running.cancelled():
            running.exception()  # retrieved: CallCancelled is how it was meant to end
        raise


__all__ = [
    "CURRENT",
    "CallCancelled",
    "CallScope",
    "CallsClosed",
    "InFlight",
    "LoopSandbox",
    "awaited_port",
    "commit_window",
    "run_awaited",
]
