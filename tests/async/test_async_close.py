"""Closing the async API awaits the clean-ups handed off to its threads (``Detach``) on the loop: the loop keeps
serving meanwhile (issue 24), and no clean-up handed over during a close is dropped unrun."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from sandforge.sandbox import AsyncSandbox, SandboxConfig
from sandforge.sandbox.aio import Threads

GUARD_S = 30.0  # a hang guard: a close that blocks the loop fails the test after this, instead of hanging it


def slow_cleanup() -> tuple[Callable[[], None], threading.Event, threading.Event]:
    """A clean-up that ends only when ``release`` is set (or the guard expires), noting whether it was."""
    release, released = threading.Event(), threading.Event()

    def cleanup() -> None:
        if release.wait(GUARD_S):
            released.set()

    return cleanup, release, released


async def close_while_ticking(close: Callable[[], asyncio.Future[None] | asyncio.Task[None]],
                              release: threading.Event) -> tuple[int, bool]:  # fmt: skip
    """Start ``close``; a ticker on the same loop releases the clean-up once it has run 100 times after the
    close began (it never does if the close blocks the loop). Returns the ticks and whether the close was still
    waiting when the ticker released the clean-up."""
    ticks = 0
    closing = close()
    while ticks < 100:
        await asyncio.sleep(0)
        ticks += 1
    waiting = not closing.done()
    release.set()
    await closing
    return ticks, waiting


def test_an_async_close_keeps_the_loop_answering_while_a_detached_cleanup_runs() -> None:
    cleanup, release, released = slow_cleanup()
    threads = Threads(short=1, long=1)
    threads.detach(cleanup)

    async def main() -> tuple[int, bool]:
        return await close_while_ticking(lambda: asyncio.ensure_future(threads.shutdown_async()), release)

    ticks, waiting = asyncio.run(main())
    assert released.is_set(), "the close blocked the loop: the ticker never released the clean-up"
    assert ticks == 100 and waiting  # the close waited for the clean-up, and the loop served the ticker meanwhile
    assert threads.short._shutdown and threads.long._shutdown  # then stopped both pools


def test_async_sandbox_aclose_awaits_the_detached_cleanup_without_blocking_the_loop() -> None:
    cleanup, release, released = slow_cleanup()

    async def main() -> tuple[int, bool]:
        asb = AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=0))
        asb.threads.detach(cleanup)
        return await close_while_ticking(lambda: asyncio.ensure_future(asb.aclose()), release)

    _, waiting = asyncio.run(main())
    assert released.is_set(), "aclose blocked the loop: the ticker never released the clean-up"
    assert waiting


def test_a_cleanup_handed_over_while_a_close_waits_is_run_not_dropped() -> None:
    """The close's last check and the pools' stop are one step: a clean-up detached while the close waits for
    another is waited for too (or, once the pools stopped, run in place), never cancelled in the queue. The
    first one holds the clean-up thread, so the second goes to the short pool, queued behind a held task."""
    ran: list[str] = []
    busy, first_may_end = threading.Event(), threading.Event()
    threads = Threads(short=1, long=1)
    hold = threads.short.submit(lambda: busy.wait(GUARD_S))  # the one short thread, held: what follows queues

    def first() -> None:
        first_may_end.wait(GUARD_S)
        ran.append("first")

    threads.detach(first)  # on the clean-up thread, which it holds

    async def main() -> None:
        closing = asyncio.ensure_future(threads.shutdown_async())
        await asyncio.sleep(0)  # the close waits for the first clean-up
        threads.detach(lambda: ran.append("second"))  # the clean-up thread is busy: the short pool, queued
        assert len(threads._detached) == 1
        busy.set()
        for _ in range(100):  # a close that stopped the pools without waiting for the second has finished by now
            await asyncio.sleep(0)
        first_may_end.set()
        await closing
        threads.detach(lambda: ran.append("third"))  # after the stop: in place

    asyncio.run(main())
    assert hold.done()
    assert sorted(ran[:2]) == ["first", "second"] and ran[2] == "third"


def test_the_sync_shutdown_still_waits_for_detached_cleanup() -> None:
    cleanup, release, released = slow_cleanup()
    threads = Threads(short=1, long=1)
    threads.detach(cleanup)
    threading.Timer(0.05, release.set).start()
    threads.shutdown()
    assert released.is_set()
