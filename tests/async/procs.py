"""Sandbox processes as the tests of the async API see them (the zygotes are this process's children)."""

from __future__ import annotations

import asyncio

import psutil


def workers() -> set[int]:
    """Sandbox processes: this process's grandchildren and below (its children are the zygotes).

    A child may end while it is listed: the leftovers pass a backend starts runs ``runc list`` and ``runsc
    list`` as children of this process, just when the first execution starts. Such a child has no
    grandchildren to count; asking for them raises NoSuchProcess, which made this helper (not the code under
    test) fail about one run in six, leaving the test's call running (issue 24)."""
    found: set[int] = set()
    for child in psutil.Process().children():
        try:
            found.update(p.pid for p in child.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def alive(pids: set[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.add(pid)
        except psutil.NoSuchProcess:
            continue
    return found


async def gone(pids: set[int]) -> set[int]:
    """``pids`` still alive once they had the time a killed process takes to die (SIGKILL is delivered when the
    process is next scheduled: a timeout's clean-up leaves the same moment's grace); a hang guard, not a timing
    goal: what is left was not killed."""
    for _ in range(1000):
        if not alive(pids):
            return set()
        await asyncio.sleep(0.01)
    return alive(pids)


async def wait_for_new(before: set[int]) -> set[int]:
    """The sandbox processes started since ``before``, polled until there is one."""
    for _ in range(3000):
        new = workers() - before
        if new:
            return new
        await asyncio.sleep(0.01)
    raise AssertionError("no sandbox process appeared")
