"""AsyncSandbox: the sync API's executions, awaited on the loop (sandbox/steps.py, sandbox/aio.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from sandforge.sandbox import (
    AsyncSandbox,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    Limits,
    Sandbox,
    SandboxConfig,
)
from sandforge.sandbox.exchange import serving_deadline
from sandforge.sandbox.protocol import CallFrame

from .procs import gone, wait_for_new, workers

T = TypeVar("T")
COUNTER = "context['n'] = context.get('n', 0) + args[0]\nreturn context['n']"
SPIN = "while True:\n    pass"
#: Long enough that only the cancellation (or the test's own timeout) can end it.
LONG = Limits(timeout_s=600)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_an_awaited_execution_is_the_sync_one(sandbox_backend: str) -> None:
    config = SandboxConfig(backend=sandbox_backend, pool_size=1)
    request = ExecutionRequest(code=COUNTER, context={"n": 1}, args=[2])
    with Sandbox(config) as sb:
        sync = sb.execute(request)

    async def main() -> ExecutionOutcome:
        async with AsyncSandbox(config) as asb:
            return await asb.execute(request)

    out = run(main())
    assert sync.ok and out.ok, (sync, out)
    assert out.value == sync.value == 3
    assert out.context == sync.context == {"n": 3}
    assert out.backend == sync.backend == sandbox_backend


def test_failures_are_outcomes_as_in_the_sync_api() -> None:
    config = SandboxConfig(backend="subprocess", pool_size=1)

    async def main() -> tuple[ExecutionOutcome, ExecutionOutcome]:
        async with AsyncSandbox(config) as asb:
            raised = await asb.execute(ExecutionRequest(code="return 1 / 0"))
            timed = await asb.execute(ExecutionRequest(code=SPIN, limits=Limits(timeout_s=1)))  # outside the pool
            return raised, timed

    raised, timed = run(main())
    assert raised.error_type is ErrorType.EXECUTION and "ZeroDivisionError" in (raised.error_message or "")
    assert timed.error_type is ErrorType.TIMEOUT


def test_nested_calls_are_answered_on_a_thread_with_the_execution_deadline() -> None:
    seen: list[tuple[str, float | None, bool]] = []
    loop_thread: list[threading.Thread] = []

    def bridge(call: CallFrame) -> dict[str, Any]:
        seen.append((call.target.name, serving_deadline(), threading.current_thread() in loop_thread))
        return {"status": "ok", "value": 21}

    async def main() -> ExecutionOutcome:
        loop_thread.append(threading.current_thread())
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=1)) as asb:
            code = "return tool('helper').twice(2).value * 2"
            return await asb.execute(ExecutionRequest(code=code), bridge=bridge)

    out = run(main())
    assert out.ok and out.value == 42, out
    [(name, deadline, on_loop)] = seen
    assert name == "helper" and deadline is not None and not on_loop


def test_many_concurrent_awaits_need_few_threads() -> None:
    count = 64

    # Threads this run starts, not those other tests of the same worker process left running (servers, engine
    # watchers): counted from before the sandbox exists.
    before = threading.active_count()

    async def main() -> tuple[list[ExecutionOutcome], int]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=2)) as asb:
            peak = threading.active_count()
            done = False

            async def watch() -> None:
                nonlocal peak
                while not done:
                    peak = max(peak, threading.active_count())
                    await asyncio.sleep(0.002)

            watcher = asyncio.create_task(watch())
            outs = await asyncio.gather(*(asb.execute(ExecutionRequest(code="return args[0] * 2", args=[i]))
                                          for i in range(count)))  # fmt: skip
            done = True
            await watcher
            return list(outs), peak

    outs, peak = run(main())
    assert [o.value for o in outs] == [2 * i for i in range(count)]
    assert peak - before < count // 2, f"{peak - before} threads for {count} concurrent executions"


def test_cancelling_ends_the_execution_and_cleans_up() -> None:
    async def main() -> tuple[set[int], set[int]]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=0, limits=LONG)) as asb:
            assert (await asb.execute(ExecutionRequest(code="return 1", limits=LONG))).ok  # the zygote is up
            before = workers(asb.sandbox)
            task = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=LONG)))
            running = await wait_for_new(before, asb.sandbox)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return running, await gone(running)

    running, still = run(main())
    assert running
    assert not still, "the cancelled sandbox is still running"


def test_cancelling_while_the_worker_starts_leaves_nothing_running() -> None:
    async def main() -> set[int]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=0)) as asb:
            before = workers(asb.sandbox)
            task = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=LONG)))  # starts a zygote
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await gone(workers(asb.sandbox) - before)

    assert not run(main())


def test_cancelling_during_a_nested_call_does_not_wait_for_its_answer() -> None:
    release = threading.Event()
    answered: list[bool] = []
    asked = threading.Event()

    def bridge(call: CallFrame) -> dict[str, Any]:
        asked.set()
        release.wait(60)
        answered.append(True)
        return {"status": "ok", "value": 1}

    async def main() -> set[int]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=0)) as asb:
            assert (await asb.execute(ExecutionRequest(code="return 1"))).ok
            before = workers(asb.sandbox)
            request = ExecutionRequest(code="return tool('slow').work().value", limits=LONG)
            task = asyncio.create_task(asb.execute(request, bridge=bridge))
            await asyncio.get_running_loop().run_in_executor(None, asked.wait, 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not answered, "the cancellation waited for the nested call's answer"
            left = await gone(workers(asb.sandbox) - before)
            release.set()
            return left

    try:
        assert not run(main())
    finally:
        release.set()


def test_a_cancelled_await_does_not_leak_the_worker_it_was_waiting_for() -> None:
    """Three calls wait for the single warm worker, which a spinning call holds; all three are cancelled.

    The busy call runs on the pool's limits, so it takes the warm worker in its first step and the others
    really wait (checked: ``cancel()`` returns True for each). It used to run on other limits, outside the pool
    (CI9): the first "waiting" call then took the warm worker itself, and when the loop's thread lost the GIL
    long enough (another thread of the process running), that call had finished its whole execution in its
    first step, before ``cancel()``; ``cancel()`` returned False and the call rightly returned its outcome."""
    limits = Limits(timeout_s=2)

    async def main() -> tuple[dict[str, int], list[bool]]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=1, limits=limits)) as asb:
            pool = asb.sandbox.pool()
            assert pool.wait_ready(1, timeout=30)
            busy = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=limits)))
            waiting = [asyncio.create_task(asb.execute(ExecutionRequest(code="return 1", limits=limits)))
                       for _ in range(3)]  # fmt: skip
            await asyncio.sleep(0)  # each has run its first step: busy holds the worker, the others wait
            held = dict(pool.stats)
            accepted = [task.cancel() for task in waiting]
            for task in waiting:
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert (await busy).error_type is ErrorType.TIMEOUT
            ready = await asyncio.get_running_loop().run_in_executor(None, pool.wait_ready, 1, 30.0)
            assert ready
            last = await asb.execute(ExecutionRequest(code="return 7", limits=limits))
            assert last.value == 7
            return held, accepted

    held, accepted = run(main())
    assert held["warm_hits"] == 1 and held["waited"] == 3, held
    assert accepted == [True, True, True]  # none had finished: each was cancelled while it waited


def test_asyncio_timeout_around_an_execution_ends_it() -> None:
    async def main() -> set[int]:
        async with AsyncSandbox(SandboxConfig(backend="subprocess", pool_size=0, limits=LONG)) as asb:
            assert (await asb.execute(ExecutionRequest(code="return 1", limits=LONG))).ok
            before = workers(asb.sandbox)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asb.execute(ExecutionRequest(code=SPIN, limits=LONG))
            return await gone(workers(asb.sandbox) - before)

    assert not run(main())
