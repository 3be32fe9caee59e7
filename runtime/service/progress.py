"""Progress of the environment build one request causes (issue 39 item 3), heard where the build runs (a worker
thread) and delivered on the event loop that answers the request: ``POST /v1/exec`` streams it as server-sent
events, the MCP exec tool sends it as ``notifications/progress``. A cached environment says nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

#: How long a build waits for one message to be handed to the loop (a gone client does not stall it).
DELIVERY_WAIT_S = 5.0


def on_loop(deliver: Callable[[str], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """A progress callback that runs ``deliver(message)`` on the calling loop, in order: from a worker thread it
    waits (at most ``DELIVERY_WAIT_S``) until the loop took it, so every message goes out before the answer."""
    loop = asyncio.get_running_loop()

    def heard(message: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # planned on the loop itself: never block it
            loop.create_task(deliver(message))  # noqa: RUF006 - fire and forget, ordered by the loop
            return
        sent = asyncio.run_coroutine_threadsafe(deliver(message), loop)
        with contextlib.suppress(Exception):
            sent.result(timeout=DELIVERY_WAIT_S)

    return heard


@contextlib.contextmanager
def hearing(progress: Callable[[str], None] | None) -> Iterator[None]:
    """Within the block (on this thread, or in the context it runs), an environment build reports to
    ``progress`` (``runtime.agent.environment.BUILD_PROGRESS``)."""
    from sandforge.runtime.agent.environment import BUILD_PROGRESS

    token = BUILD_PROGRESS.set(progress)
    try:
        yield
    finally:
        BUILD_PROGRESS.reset(token)
