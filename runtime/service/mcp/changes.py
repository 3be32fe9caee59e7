"""``notifications/tools/list_changed``: telling MCP clients that the set of persisted tools changed.

The persisted tools an MCP client sees are the tenant's healthy, reusable stored methods
(``persisted.exposed``), so the list changes when a call forges or proves one, when one degrades, or when
another process (``sandforge serve``'s HTTP API, the Python API) changes the store. :class:`ToolListWatch`
keeps the list's signature (names, the methods behind them, their contracts) and, whenever it differs from
the last one seen, tells every client, in both eras of the protocol:

- 2026-07-28 clients listen on ``subscriptions/listen`` (``Client.listen(tools_list_changed=True)``): the
  event goes on the server's subscription bus, and the SDK declares ``listChanged`` for them;
- handshake-era clients (``initialize``): the server declares ``tools.listChanged`` in its capabilities and
  sends the notification to every session that listed the tools.

It is checked after every tool call that may change the store, when the HTTP service reports an agent call
of the tenant, and every ``poll_s`` seconds while the server runs (changes made by other processes).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import SubscriptionBus, ToolsListChanged

log = logging.getLogger(__name__)

#: How often a running server looks for changes it did not make itself (seconds).
POLL_S = 2.0

Signature = frozenset[tuple[str, ...]]


def declare_list_changed(server: Server[Any]) -> None:
    """Make ``server`` declare ``tools.listChanged`` to handshake-era clients (the SDK's runners ask
    ``create_initialization_options()`` without notification options)."""
    original = server.create_initialization_options

    def options(notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any) -> Any:
        return original(notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)

    server.create_initialization_options = options  # type: ignore[method-assign]


class ToolListWatch:
    """The last signature of the tool list seen, and who to tell when it changes."""

    def __init__(self, signature: Callable[[], Signature], bus: SubscriptionBus, *, poll_s: float = POLL_S) -> None:
        self._signature = signature
        self._bus = bus
        self.poll_s = poll_s
        self._known: Signature | None = None
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = anyio.Lock()
        self._in_use: anyio.Event | None = None
        self._used = False
        #: notifications sent (for tests and logs)
        self.sent = 0

    def used(self) -> None:
        """A client sent more than the handshake: from now on the watch reads the store (see :meth:`watch`)."""
        self._used = True
        if self._in_use is not None:
            self._in_use.set()

    def remember(self, session: Any) -> None:
        """The connection of a session that listed the tools gets the handshake-era notification when they
        change (the SDK's ServerSession is made per request; its connection lives as long as the client's)."""
        connection = getattr(session, "_connection", None)
        if connection is not None and hasattr(connection, "send_tool_list_changed"):
            self._sessions.add(connection)

    async def baseline(self) -> None:
        """Record the list as it is now (a server that starts sends nothing for what it finds)."""
        async with self._lock:
            self._known = await anyio.to_thread.run_sync(self._signature)

    async def refresh(self) -> bool:
        """Compare with the store now; on a change tell every client. True when the list changed."""
        async with self._lock:
            current = await anyio.to_thread.run_sync(self._signature)
            known, self._known = self._known, current
            if known is None or known == current:
                return False
        await self._notify()
        return True

    async def _notify(self) -> None:
        self.sent += 1
        await self._bus.publish(ToolsListChanged())
        for session in list(self._sessions):
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # a closed session: forget it
                log.debug("tools/list_changed not delivered: %s", exc)
                self._sessions.discard(session)

    async def watch(self) -> None:
        """Poll until cancelled (changes made outside this server). It starts reading the store only once a
        client sent more than the handshake (:meth:`used`), so nothing competes with the ``initialize`` answer
        (a host waits for it before it shows the server) and a server nobody uses never opens its store."""
        self._in_use = anyio.Event()
        if self._used:
            self._in_use.set()
        await self._in_use.wait()
        await self.baseline()
        while True:
            await anyio.sleep(self.poll_s)
            try:
                await self.refresh()
            except Exception:  # a store that cannot be read now may be readable at the next poll
                log.warning("the tool list could not be checked for changes", exc_info=True)
