"""Sandbox processes as the tests of the async API see them (the zygotes are this process's children)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import psutil

from sandforge.sandbox import Sandbox


def zygotes(sandbox: Sandbox) -> set[int]:
    """The zygote processes of ``sandbox``'s subprocess backends (each started on its first execution)."""
    found = set()
    for backend in list(sandbox._backends.values()):
        found.update(z.proc.pid for z in list(getattr(backend, "_zygotes", {}).values()))
    return found


def workers(of: Sandbox | None = None) -> set[int]:
    """Sandbox processes: this process's children in a pid namespace of their own (a zygote's runners, which
    it clones as this process's children: ``Zygote.spawn``) and its grandchildren and below (its other
    children are the zygotes); with ``of``, only ``sandbox``'s (its zygotes' runners and descendants).

    A test that counts what its call started must say ``of``: another sandbox's warm pool refills on its own
    threads, and a worker it starts while the test runs is new to an unscoped count, and rightly never ends
    (it waits, warm, for a request). The module's shared pool did that just after the tests that drained it,
    about one run in ten under load, and failed the cancellation test (issue 24).

    A child may end while it is listed: the leftovers pass a backend starts runs ``runc list`` and ``runsc
    list`` as children of this process, just when the first execution starts. Such a child has no
    grandchildren to count; asking for them raises NoSuchProcess, which made this helper (not the code under
    test) fail about one run in six, leaving the test's call running (issue 24)."""
    found: set[int] = set()
    roots = psutil.Process().children() if of is None else _processes(zygotes(of))
    found.update(_adopted_runners() if of is None else _adopted_of(of))
    for child in roots:
        try:
            found.update(p.pid for p in child.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _adopted_runners() -> set[int]:
    """This process's children in another pid namespace than its own: runners a zygote cloned for it."""
    own, found = os.readlink("/proc/self/ns/pid"), set()
    for child in psutil.Process().children():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{child.pid}/ns/pid") != own:
                found.add(child.pid)
    return found


def _adopted_of(sandbox: Sandbox) -> set[int]:
    """The runners ``sandbox``'s zygotes cloned as this process's children, not reaped yet."""
    found: set[int] = set()
    for backend in list(sandbox._backends.values()):
        for zygote in list(getattr(backend, "_zygotes", {}).values()):
            found.update(list(getattr(zygote, "_adopted", {})))
    return found


def _processes(pids: set[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
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


async def wait_for_new(before: set[int], of: Sandbox | None = None) -> set[int]:
    """The sandbox processes (of ``of``'s, if given) started since ``before``, polled until there is one."""
    for _ in range(3000):
        new = workers(of) - before
        if new:
            return new
        await asyncio.sleep(0.01)
    raise AssertionError("no sandbox process appeared")
