"""One implementation, two drivers: an execution written as steps that say when they would wait.

The code that runs one execution (``exchange.exchange_steps`` and the workers' ``steps``) is a generator. It
does its work itself and *yields* only where it would wait: :class:`Poll` (for a worker's output) and
:class:`Blocking` (a call that may take a while: a nested call's answer, reaping an exit). The driver performs
the wait and sends the answer back in. :func:`run_steps` waits by blocking its thread (the sync API);
``sandbox/aio.py`` waits on the event loop (file descriptors registered with the loop, blocking calls on a
small shared thread pool), so many concurrent executions need no thread each.

A driver may throw :class:`Cancelled` into the steps at the point where they wait (the awaiting task was
cancelled): the exchange then ends as a timeout does (the worker killed, nothing returned as a success) and
the worker cleans up as after any execution.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from sandforge.sandbox.channel import Stream, WorkerIO

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Poll:
    """Wait up to ``timeout`` seconds for ``io``'s output; the answer is ``io.poll``'s list of chunks."""

    io: WorkerIO
    timeout: float


@dataclass(frozen=True, slots=True)
class Blocking:
    """Call ``fn()`` where a blocking call may run (off the event loop); the answer is its return value
    (its exception is raised at the yield)."""

    fn: Callable[[], Any]
    #: May the steps go on (with :class:`Cancelled`) while ``fn`` still runs? Yes for a nested call's answer
    #: (nothing of the worker is touched; a late answer is dropped), no for reaping the worker's exit.
    interruptible: bool = False
    #: Called (once, from the driver) when the wait is cancelled: makes ``fn`` return soon (e.g. kills the
    #: worker whose execution it is); for an interruptible call, tells whoever runs it to stop (a cluster node
    #: ends the execution it runs for ``fn``), as nobody waits for its answer any more.
    on_cancel: Callable[[], None] | None = None
    #: The same wait as a coroutine, for a driver on an event loop: awaited there instead of ``fn`` on a thread
    #: (a worker's exit report, which a reader thread can wake the loop for). Cancelling it throws
    #: :class:`Cancelled` into the steps at once, as for an interruptible call.
    on_loop: Callable[[], Awaitable[Any]] | None = None


@dataclass(frozen=True, slots=True)
class Await:
    """Only in steps the async driver runs: await ``start()`` on the loop (a warm pool's hand-out, which holds
    no thread). Its value is the answer; its exception (CancelledError too, as :class:`Cancelled`) is raised
    at the yield. The sync outline asks for the same thing as a :class:`Blocking` call instead."""

    start: Callable[[], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Detach:
    """Call ``fn()`` where a blocking call may run, and go on without its answer: clean-up whose result nobody
    needs (destroying a worker whose outcome is already known). The sync driver calls it in place; the async
    one hands it to its short thread pool, whose shutdown waits for it (nothing outlives a close)."""

    fn: Callable[[], None]


Effect = Poll | Blocking | Await | Detach
#: Steps that end with a value of type T.
Steps = Generator[Effect, Any, T]
Chunks = list[tuple[Stream, bytes]]


class Cancelled(Exception):
    """Thrown into steps where they wait: whoever awaited them is gone (an asyncio task was cancelled)."""


def then_destroy(steps: Steps[T], destroy: Callable[[], None]) -> Steps[T]:
    """``steps``, then their worker destroyed as a :class:`Detach` call: off the event loop in the async API
    (closing descriptors and removing a work directory are syscalls, which on one loop add up across every
    execution in flight) and without holding the outcome back for a thread's hand-over (``POST /v1/exec``
    awaits it). Destroyed in place when the steps raise (``Cancelled`` too), so a cancelled execution is
    cleaned up before its caller hears of it."""
    try:
        result = yield from steps
    except BaseException:
        destroy()
        raise
    yield Detach(destroy)
    return result


def run_steps(steps: Steps[T], detach: Callable[[Callable[[], None]], object] | None = None) -> T:
    """Drive ``steps`` on this thread, blocking where they wait: the sync API. What a blocking call raises is
    raised in the steps, at their yield (as if they had made the call themselves). A :class:`Detach` call runs
    in place, or is handed to ``detach`` (a cluster node's clean-up threads: its caller gets the outcome before
    the worker is gone)."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        answer, error = None, None
        if isinstance(effect, Poll):
            answer = effect.io.poll(effect.timeout)
            continue
        if isinstance(effect, Await):
            raise TypeError("an Await step needs the async driver (sandbox/aio.py)")
        if isinstance(effect, Detach):
            if detach is None:
                effect.fn()  # on this thread: the sync API has no loop to keep free
            else:
                detach(effect.fn)
            continue
        try:
            answer = effect.fn()
        except BaseException as exc:  # re-raised inside the steps, where their finally blocks run
            error = exc


__all__ = [
    "Await", "Blocking", "Cancelled", "Chunks", "Detach", "Effect", "Poll", "Steps", "run_steps", "then_destroy",
]
