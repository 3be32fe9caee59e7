"""An awaited agent call and an async session turn cancelled at each place their execution waits (issue 24).

The task cancelled is the caller's (``await calc.call(...)``, ``await chat.send(...)``), at the moment its
execution's steps yield one kind of effect (``sweep.Sweep``): the hand-out of a worker, a poll, the exit report,
the clean-up hand-off (the outcome is known by then, not yet committed). Every window ends the same way:
``CancelledError``, the worker destroyed, no worker left, the role's context unchanged and nothing recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import CallLog
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.sessions import AgentToolRunner, SessionStore
from sandforge.runtime.sessions.aio import AsyncSession
from sandforge.sandbox import Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessWorker
from tests.sessions.helpers import call, load, make_session

from .sweep import Spawns, Sweep, ended, left_alive

T = TypeVar("T")
LIMITS = Limits(timeout_s=60)
ADD = "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']"
SPIN_AFTER_WRITING = "context['total'] = 999\nwhile True:\n    pass"
SEARCH = "context['q'] = kwargs['query']\nreturn ['m1']"
GUARD_S = 120.0
WINDOWS = ["acquire", "poll", "exit", "detach"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def exit_on_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit report is never in already: the steps always yield its wait (else whether they do is timing)."""
    monkeypatch.setattr(SubprocessWorker, "_reported_exit", lambda self: None)


async def cancelled(task: asyncio.Task[Any]) -> bool:
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(asyncio.CancelledError):
            await task
    return task.cancelled()


@pytest.mark.parametrize("pool_size", [1, 0], ids=["warm", "cold"])
@pytest.mark.parametrize(("code", "at"), [*((ADD, a) for a in WINDOWS), (SPIN_AFTER_WRITING, "poll")],
                         ids=[*(f"add-{a}" for a in WINDOWS), "spin-poll"])  # fmt: skip
@pytest.mark.usefixtures("exit_on_loop")
def test_a_cancelled_agent_call_commits_nothing_and_leaves_no_worker(
    monkeypatch: pytest.MonkeyPatch, pool_size: int, code: str, at: str
) -> None:  # fmt: skip
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=pool_size, limits=LIMITS))
    spawns = Spawns(sb, monkeypatch)
    pool = sb.pool()
    assert pool_size == 0 or pool.wait_ready(1, timeout=GUARD_S)
    calls: list[asyncio.Task[Any]] = []
    sweep = Sweep(monkeypatch, at, target=lambda: calls[0])
    log = CallLog(None)

    async def main() -> tuple[bool, dict[str, Any], bool]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([code]), sandbox=sb, log=log,
                                       context={"total": 1}) as calc:  # fmt: skip
            calls.append(asyncio.create_task(calc.call("add", 3)))
            was_cancelled = await cancelled(calls[0])
            return was_cancelled, calc.context, await ended(sweep.handed)

    try:
        was_cancelled, context, handed_ended = run(main())
        assert sweep.fired, sweep.kinds
        assert was_cancelled and handed_ended
        # cold, cancelled at the hand-out: the worker may be destroyed unused, as it starts (``unless_cancelled``)
        assert sweep.handed or (pool_size, at) == (0, "acquire")
        assert context == {"total": 1} and log.records == []
        assert not left_alive(spawns, pool)
    finally:
        sb.close()


@pytest.mark.parametrize("at", WINDOWS)
@pytest.mark.usefixtures("exit_on_loop")
def test_a_cancelled_session_turn_commits_no_tool_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, at: str
) -> None:  # fmt: skip
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=LIMITS))
    spawns = Spawns(sb, monkeypatch)
    pool = sb.pool()
    assert pool.wait_ready(1, timeout=GUARD_S)
    turns: list[asyncio.Task[Any]] = []
    sweep = Sweep(monkeypatch, at, target=lambda: turns[0])
    runner = AgentToolRunner(provider=ScriptedProvider([SEARCH]), sandbox=sb, log=False)
    store = SessionStore(state=tmp_path / "state")
    script: list[Any] = [load("google_gmail"), call("gmail_search", query="x"), "Found them."]
    try:
        session, _ = make_session(store, script, runner=runner)

        async def main() -> tuple[bool, bool]:
            async with AsyncSession(session) as chat:
                turns.append(asyncio.create_task(chat.send("find x")))
                was_cancelled = await cancelled(turns[0])
                return was_cancelled, await ended(sweep.handed)

        was_cancelled, handed_ended = run(main())
        assert sweep.fired, sweep.kinds
        assert was_cancelled and handed_ended and sweep.handed
        assert runner.workspace is not None and runner.workspace.context("gmail") == {}
        assert not left_alive(spawns, pool)
    finally:
        runner.close()
        store.close()
        sb.close()
