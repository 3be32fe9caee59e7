"""Async chat sessions: ``await session.send(text)`` on the sync :class:`Session`'s own turn.

Import it from here (``sandforge.runtime.sessions.aio``): the package itself stays light to import, and this
module loads the agent and sandbox layers.

    async with AsyncSession(Session.create(store, provider=chat, runner=runner)) as chat:
        turn = await chat.send("what is 2 + 3?")

A turn runs :meth:`Session.send` on the session's thread (one turn at a time, as a Session serialises them;
waiting for the turn holds no thread); every tool it runs through the agent layer has its executions awaited on
the event loop (``runtime/agent/awaited.py``). The chat provider's requests and the SQLite history stay on that
thread.

Cancelling the awaiting task cancels the tool execution in flight and stops the rest (their agents commit
nothing: ``runtime/agent/aio.py``); the task gets ``CancelledError`` once the turn has unwound. The history keeps
what the turn had stored before (the user's message, the steps before the cancellation): it is a transcript.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from sandforge.runtime.agent.awaited import InFlight, run_awaited
from sandforge.runtime.sessions.models import Message, SessionInfo
from sandforge.runtime.sessions.session import Session, TurnResult
from sandforge.sandbox.aio import Threads


class AsyncSession:
    """A :class:`Session` for asyncio (the same conversation, history and tools). ``threads`` are the async
    sandbox threads its tools' executions use (default: its own, closed with it)."""

    def __init__(self, session: Session, *, threads: Threads | None = None) -> None:
        self.session = session
        self._threads = threads or Threads()
        self._owns_threads = threads is None
        self._turn = asyncio.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandforge-turn")
        self._calls = InFlight()

    @property
    def id(self) -> str:
        return self.session.id

    async def send(self, text: str) -> TurnResult:
        """One user turn (:meth:`Session.send`), awaited."""
        async with self._turn:
            turn = functools.partial(self.session.send, text)
            return await run_awaited(turn, thread=self._thread, threads=self._threads, calls=self._calls)

    async def info(self) -> SessionInfo:
        return await asyncio.get_running_loop().run_in_executor(self._thread, lambda: self.session.info)

    async def history(self) -> list[Message]:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.session.history)

    async def aclose(self) -> None:
        """Stop this object's threads (the session's store and runner belong to whoever made them). A turn still
        running is cancelled first and waited for (its task gets CancelledError); later turns raise CallsClosed."""
        self._calls.close()
        await asyncio.get_running_loop().run_in_executor(self._thread, _nothing)  # the turn thread has unwound
        self._thread.shutdown(wait=False)
        if self._owns_threads:
            await self._threads.shutdown_async()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _nothing() -> None:
    return None


__all__ = ["AsyncSession"]
