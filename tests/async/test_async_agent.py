"""AsyncAgent / AsyncWorkspace / AsyncSession: the one lifecycle awaited, cancellation that commits nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandforge import AsyncAgent, AsyncSandbox
from sandforge.runtime.agent import Agent, CallLog, Outcome
from sandforge.runtime.agent.awaited import CURRENT, CallCancelled, CallScope
from sandforge.runtime.agent.state import State, Transaction
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.sessions import AgentToolRunner, SessionStore, ToolStatus
from sandforge.runtime.sessions.aio import AsyncSession
from sandforge.sandbox import Limits, Sandbox, SandboxConfig
from sandforge.sandbox.aio import Threads
from sandforge.sandbox.context import ContextSnapshot
from tests.sessions.helpers import call, load, make_session

from .procs import alive, gone, wait_for_new, workers

T = TypeVar("T")
ADD = "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']"
SPIN_AFTER_WRITING = "context['total'] = 999\nwhile True:\n    pass"
LONG = Limits(timeout_s=600)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def shared() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=2, limits=LONG))
    try:
        yield sb
    finally:
        sb.close()


@pytest.fixture(scope="module")
def cold() -> Iterator[Sandbox]:
    """No warm workers: the sandbox processes that appear are the executions' own."""
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=0, limits=LONG))
    try:
        yield sb
    finally:
        sb.close()


def test_awaited_calls_commit_as_sync_calls_do(shared: Sandbox) -> None:
    async def main() -> tuple[Outcome, Outcome, dict[str, Any], Any]:
        provider = ScriptedProvider([ADD, ADD])
        async with AsyncAgent.for_role("calc", provider=provider, sandbox=shared, log=False,
                                       context={"total": 10}) as calc:  # fmt: skip
            explicit = await calc.call("add", 5)
            dynamic = await calc.add(5)
            return explicit, dynamic, calc.context, calc.total

    explicit, dynamic, context, total = run(main())
    assert explicit.ok and explicit.value == 15, explicit
    assert dynamic.ok and dynamic.value == 20, dynamic
    assert context == {"total": 20} and total == 20


def test_concurrent_awaits_on_one_workspace_lose_no_update(shared: Sandbox) -> None:
    async def main() -> tuple[list[Outcome], dict[str, Any]]:
        async with AsyncAgent.for_role("calc", provider=ScriptedProvider([ADD] * 6), sandbox=shared, log=False,
                                       context={"total": 0}) as calc:  # fmt: skip
            outs = await asyncio.gather(*(calc.call("add", n) for n in (1, 2, 3, 4, 5, 6)))
            return list(outs), calc.context

    outs, context = run(main())
    assert all(o.ok for o in outs), outs
    assert context == {"total": 21}


def test_cancelling_a_call_kills_its_execution_and_commits_nothing(cold: Sandbox) -> None:
    """Every worker of ``cold`` (it keeps none warm) is this call's, and none is left once it is cancelled. The
    count is ``cold``'s own: the module's shared pool refilling meanwhile is not this call's (issue 24)."""
    log = CallLog(None)

    async def main() -> tuple[dict[str, Any], set[int]]:
        provider = ScriptedProvider([SPIN_AFTER_WRITING])
        async with AsyncAgent.for_role("calc", provider=provider, sandbox=cold, log=log,
                                       context={"total": 1}) as calc:  # fmt: skip
            before = workers(cold)
            task = asyncio.create_task(calc.call("spin"))
            running = await wait_for_new(before, cold)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return calc.context, await gone(running | workers(cold))

    context, left = run(main())
    assert context == {"total": 1}
    assert not left
    assert log.records == []  # nothing committed, nothing recorded as if it had been


def test_cancelling_stops_nested_calls_too(cold: Sandbox) -> None:
    """The top-level program waits on a nested call whose program spins: both executions end, neither role's
    context changes, and the nested call makes no execution after the cancellation."""
    outer = "context['total'] = 5\nreturn tool('helper').spin().value"
    provider = ScriptedProvider([outer, SPIN_AFTER_WRITING])

    async def main() -> tuple[dict[str, Any], dict[str, Any], set[int]]:
        async with AsyncAgent.for_role("calc", provider=provider, sandbox=cold, log=False,
                                       context={"total": 1}) as calc:  # fmt: skip
            helper = AsyncAgent.for_role("helper", workspace=calc.workspace, context={"total": 2})
            before = workers(cold)
            task = asyncio.create_task(calc.call("nest"))
            for _ in range(3000):  # both sandboxes running: the caller's and its nested call's (one process each)
                if len(alive(workers(cold) - before)) >= 2:
                    break
                await asyncio.sleep(0.01)
            running = workers(cold) - before
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return calc.context, helper.context, await gone(running)

    outer_ctx, helper_ctx, left = run(main())
    assert outer_ctx == {"total": 1} and helper_ctx == {"total": 2}
    assert not left
    assert provider.calls == 2


def test_a_commit_is_refused_once_the_call_is_cancelled() -> None:
    state = State(lambda staged: None)
    state.contexts["r"] = ContextSnapshot.from_dict({"v": 1})

    def attempt() -> None:
        txn = Transaction(state)
        txn.set_context("r", {"v": 2})
        txn.commit()

    scope = CallScope(asyncio.new_event_loop(), Threads(short=1, long=1))
    try:
        scope.cancel()
        token = CURRENT.set(scope)
        try:
            with pytest.raises(CallCancelled):
                attempt()
        finally:
            CURRENT.reset(token)
        assert state.contexts["r"].to_dict() == {"v": 1} and not scope.committed
        attempt()  # no awaiting task: a plain sync commit
        assert state.contexts["r"].to_dict() == {"v": 2}
    finally:
        scope.loop.close()
        scope.threads.shutdown()


def test_sync_agents_are_unchanged_by_the_async_api(shared: Sandbox) -> None:
    calc = Agent.for_role("calc", provider=ScriptedProvider([ADD]), sandbox=shared, log=False, context={"total": 1})
    assert calc.add(2).value == 3 and calc.context == {"total": 3}
    assert threading.current_thread() is threading.main_thread()


def test_an_async_sandbox_can_be_shared_by_agents(shared: Sandbox) -> None:
    async def main() -> list[Outcome]:
        async with AsyncSandbox(shared) as asb:
            agents = [AsyncAgent.for_role(f"r{i}", provider=ScriptedProvider([ADD]), sandbox=asb, log=False)
                      for i in range(4)]  # fmt: skip
            outs = await asyncio.gather(*(a.call("add", i) for i, a in enumerate(agents)))
            for agent in agents:
                await agent.aclose()
            return list(outs)

    assert [o.value for o in run(main())] == [0, 1, 2, 3]


def test_an_async_session_runs_its_tools_awaited(tmp_path: Path, shared: Sandbox) -> None:
    script: list[Any] = [load("google_gmail"), call("gmail_search", query="x"), "Found them."]
    search = "context['q'] = kwargs['query']\nreturn ['m1']"
    runner = AgentToolRunner(provider=ScriptedProvider([search]), sandbox=shared, log=False)
    store = SessionStore(state=tmp_path / "state")
    try:
        session, _ = make_session(store, script, runner=runner)

        async def main() -> Any:
            async with AsyncSession(session) as chat:
                return await chat.send("find x")

        turn = run(main())
        assert [(c.name, c.status) for c in turn.tool_calls] == [
            ("load_tool_group", ToolStatus.SUCCESS),
            ("gmail_search", ToolStatus.SUCCESS),
        ]
        assert turn.tool_calls[1].content == '["m1"]'
    finally:
        runner.close()
        store.close()


def test_cancelling_a_turn_cancels_its_tool(tmp_path: Path, cold: Sandbox) -> None:
    script: list[Any] = [load("google_gmail"), call("gmail_search", query="x"), "never reached"]
    runner = AgentToolRunner(provider=ScriptedProvider([SPIN_AFTER_WRITING]), sandbox=cold, log=False)
    store = SessionStore(state=tmp_path / "state")
    try:
        session, _ = make_session(store, script, runner=runner)

        async def main() -> set[int]:
            async with AsyncSession(session) as chat:
                before = workers(cold)
                task = asyncio.create_task(chat.send("find x"))
                running = await wait_for_new(before, cold)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return await gone(running)

        assert not run(main())
        assert runner.agent("gmail").call  # the role's agent exists; its context was never committed
        assert runner.workspace is not None and runner.workspace.context("gmail") == {}
    finally:
        runner.close()
        store.close()
