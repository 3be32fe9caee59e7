"""The awaited drive watches an execution's descriptors once, not around every poll: registered with the loop
at the first wait, dropped when a stream ends, and all removed before the steps do anything else (a clean-up
may close the descriptors and the system reuse their numbers), whatever way the steps end."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from sandforge.sandbox.aio import Threads, drive
from sandforge.sandbox.channel import PipeIO
from sandforge.sandbox.steps import Blocking, Poll, Steps


@contextmanager
def _io() -> Iterator[tuple[PipeIO, int, int, list[int]]]:
    """A PipeIO reading two pipes (stdout, stderr); yields it and the two write ends."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    io = PipeIO(in_w, {out_r: "stdout", err_r: "stderr"})
    try:
        yield io, out_w, err_w, [out_r, err_r]
    finally:
        io.close()
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            with suppress(OSError):
                os.close(fd)


class _Spy:
    """Counts the loop's add_reader/remove_reader calls (the real ones still run)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.added: list[int] = []
        self.removed: list[int] = []
        real_add, real_remove = loop.add_reader, loop.remove_reader

        def add(fd: int, cb: Any, *args: Any) -> None:
            self.added.append(fd)
            real_add(fd, cb, *args)

        def remove(fd: int) -> bool:
            self.removed.append(fd)
            return real_remove(fd)

        loop.add_reader = add  # type: ignore[method-assign,assignment]
        loop.remove_reader = remove  # type: ignore[method-assign,assignment]


def _write_later(loop: asyncio.AbstractEventLoop, fd: int, data: bytes, close: bool = False) -> None:
    def write() -> None:
        os.write(fd, data)
        if close:
            os.close(fd)

    loop.call_later(0.05, write)


def test_three_polls_register_each_descriptor_once_and_leave_none_behind() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        spy = _Spy(loop)
        threads = Threads(short=1, long=1)
        with _io() as (io, out_w, err_w, read_fds):

            def steps() -> Steps[list[Any]]:
                seen: list[Any] = []
                _write_later(loop, out_w, b"one")
                seen += yield Poll(io, 5.0)
                _write_later(loop, err_w, b"two")
                seen += yield Poll(io, 5.0)
                _write_later(loop, out_w, b"three")
                seen += yield Poll(io, 5.0)
                return seen

            seen = await drive(steps(), threads)
            assert seen == [("stdout", b"one"), ("stderr", b"two"), ("stdout", b"three")]
            assert sorted(spy.added) == sorted(read_fds)  # once each, not once per poll (9 before)
            assert sorted(spy.removed) == sorted(read_fds)
            assert not any(loop.remove_reader(fd) for fd in read_fds)  # nothing still registered
        await threads.shutdown_async()

    asyncio.run(scenario())


def test_a_stream_that_ends_stops_being_watched() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        spy = _Spy(loop)
        threads = Threads(short=1, long=1)
        with _io() as (io, out_w, err_w, read_fds):

            def steps() -> Steps[list[Any]]:
                seen: list[Any] = []
                _write_later(loop, out_w, b"last", close=True)
                seen += yield Poll(io, 5.0)
                if len(seen) == 1:  # the end of the stream came in a poll of its own
                    seen += yield Poll(io, 5.0)
                removed_before = len(spy.removed)
                _write_later(loop, err_w, b"after")
                seen += yield Poll(io, 5.0)
                assert spy.removed[removed_before:] == [read_fds[0]]  # the ended one, at the next wait
                return seen

            seen = await drive(steps(), threads)
            assert ("stderr", b"after") in seen and ("stdout", b"") in seen
        await threads.shutdown_async()

    asyncio.run(scenario())


@pytest.mark.parametrize("ending", ["blocking", "raise", "cancel"])
def test_nothing_stays_watched_when_the_steps_do_something_else(ending: str) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        threads = Threads(short=1, long=1)
        with _io() as (io, out_w, _err_w, read_fds):
            registered_during: list[bool] = []

            def check() -> None:  # on the loop, while the steps wait for a blocking call
                registered_during.append(any(loop.remove_reader(fd) for fd in read_fds))

            def blocking() -> None:
                checked = threading.Event()

                def on_loop() -> None:
                    check()
                    checked.set()

                loop.call_soon_threadsafe(on_loop)
                assert checked.wait(5)

            def steps() -> Steps[None]:
                _write_later(loop, out_w, b"x")
                yield Poll(io, 5.0)
                if ending == "blocking":
                    yield Blocking(blocking)
                elif ending == "raise":
                    raise RuntimeError("the steps failed")
                else:
                    yield Poll(io, 60.0)  # nothing more comes: cancelled while it waits

            task = asyncio.ensure_future(drive(steps(), threads))
            if ending == "cancel":
                await asyncio.sleep(0.3)
                task.cancel()
            with pytest.raises((RuntimeError, asyncio.CancelledError)) if ending != "blocking" else _nothing():
                await task
            await asyncio.sleep(0)
            assert registered_during == ([False] if ending == "blocking" else [])
            assert not any(loop.remove_reader(fd) for fd in read_fds)
        await threads.shutdown_async()

    asyncio.run(scenario())


@contextmanager
def _nothing() -> Iterator[None]:
    yield
