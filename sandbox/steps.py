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

from collections.abc import Callable, Generator
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
    #: Called (once, from the driver) when the wait is cancelled and ``fn`` is not interruptible: makes it
    #: return soon (e.g. kills the worker whose execution ``fn`` is).
    on_cancel: Callable[[], None] | None = None


Effect = Poll | Blocking
#: Steps that end with a value of type T.
Steps = Generator[Effect, Any, T]
Chunks = list[tuple[Stream, bytes]]


class Cancelled(Exception):
    """Thrown into steps where they wait: whoever awaited them is gone (an asyncio task was cancelled)."""


def run_steps(steps: Steps[T]) -> T:
    """Drive ``steps`` on this thread, blocking where they wait: the sync API. What a blocking call raises is
    raised in the steps, at their yield (as if they had made the call themselves)."""
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
        try:
            answer = effect.fn()
        except BaseException as exc:  # re-raised inside the steps, where their finally blocks run
            error = exc


__all__ = ["Blocking", "Cancelled", "Chunks", "Effect", "Poll", "Steps", "run_steps"]
