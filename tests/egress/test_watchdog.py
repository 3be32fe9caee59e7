"""The egress watchdog (runtime/egress/transport.py): it shuts a socket whose request outlived its deadline,
and wakes only for armed entries: a disarmed one (nearly every request ends in time) costs no wake-up of its
own later (each one took the GIL from the requests then running), and disarmed entries do not pile up."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from sandforge.runtime.egress.transport import Watchdog


class CountingCondition:
    """A ``threading.Condition`` that counts how often a wait returned (each one a wake-up of the thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.wakeups = 0

    def __enter__(self) -> bool:
        return self._cond.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cond.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        woke = self._cond.wait(timeout)
        self.wakeups += 1
        return woke

    def notify(self) -> None:
        self._cond.notify()


def test_disarmed_entries_cost_no_wake_up_each() -> None:
    dog = Watchdog()
    cond = CountingCondition()
    dog._cond = cond  # type: ignore[assignment]
    a, b = socket.socketpair()
    try:
        start = time.monotonic()
        watches = [dog.arm(a, start + 0.05 + i * 0.005) for i in range(60)]  # 60 deadlines within 0.35 s
        for watch in watches:
            dog.disarm(watch)
        time.sleep(0.6)  # past every deadline
        assert cond.wakeups <= 5, cond.wakeups  # was one per entry
        assert not any(watch.fired for watch in watches)
        assert dog.pending == 0
        b.sendall(b"x")
        assert a.recv(1) == b"x"  # never shut
    finally:
        a.close()
        b.close()


def test_an_armed_entry_behind_disarmed_ones_still_fires() -> None:
    dog = Watchdog()
    a, b = socket.socketpair()
    try:
        start = time.monotonic()
        for i in range(50):
            dog.disarm(dog.arm(a, start + 0.01 * i))
        watch = dog.arm(b, start + 0.2)
        deadline = time.monotonic() + 30
        while not watch.fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.fired
        assert b.recv(1) == b""  # shut: reads end
    finally:
        a.close()
        b.close()


def test_disarmed_entries_do_not_pile_up() -> None:
    dog = Watchdog()
    a, _b = socket.socketpair()
    far = time.monotonic() + 3600
    live = dog.arm(a, far)
    for _ in range(5 * Watchdog.COMPACT_AT):
        dog.disarm(dog.arm(a, far))
    assert dog.pending <= Watchdog.COMPACT_AT + 2
    assert live in dog._heap and not live.fired
    dog.disarm(live)
