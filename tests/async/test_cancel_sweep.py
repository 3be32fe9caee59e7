"""``AsyncSandbox.execute`` cancelled at every place it waits, warm and cold (issue 24's contract, after CI9).

The contract (``sandbox/aio.py``): a task cancelled before its execution finished gets ``CancelledError``, never
an outcome, and the worker it had is killed and cleaned up; a task that finished first keeps its outcome
(``cancel()`` then returns False). Each test here requests the cancel from inside the task, as its steps yield
one kind of effect (the worker's hand-out, a poll, the exit report, the clean-up hand-off), so the cancel lands
exactly there, with no timing. The warm pool's own windows are swept too: a call waiting for the next worker,
and a call cancelled in the very iteration its worker is delivered.

CI9's failure was the other half of the contract: the "waiting" call had a warm worker at once and finished its
whole execution in its first step (every poll found its output in, the exit report was in, the clean-up is
handed off), before ``cancel()``; ``test_a_call_that_finished_before_cancel_keeps_its_outcome`` pins that
down, deterministically.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from sandforge.sandbox import AsyncSandbox, ExecutionOutcome, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.base import Worker
from sandforge.sandbox.backends.subprocess_backend import SubprocessWorker
from sandforge.sandbox.zygote import wait_fd

from .sweep import Spawns, Sweep, ended, left_alive

T = TypeVar("T")
LIMITS = Limits(timeout_s=60)
SPIN = "while True:\n    pass"
GUARD_S = 120.0  # a lost cancellation fails the test after this instead of hanging it


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def exit_on_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit report is never in already: the steps always yield its wait (else whether they do is timing)."""
    monkeypatch.setattr(SubprocessWorker, "_reported_exit", lambda self: None)


def sandbox(pool_size: int) -> Sandbox:
    return Sandbox(SandboxConfig(backend="subprocess", pool_size=pool_size, limits=LIMITS))


WINDOWS = [
    ("return 1", "acquire"),  # warm: the hand-out does not wait, so the cancel lands at the first poll
    ("return 1", "poll"),
    ("return 1", "exit"),
    ("return 1", "detach"),  # the outcome is known, but the task is cancelled before it returns: no outcome
    (SPIN, "poll"),
]


@pytest.mark.parametrize("pool_size", [1, 0], ids=["warm", "cold"])
@pytest.mark.parametrize(("code", "at"), WINDOWS, ids=[f"{'spin' if c == SPIN else 'return'}-{a}" for c, a in WINDOWS])
@pytest.mark.usefixtures("exit_on_loop")
def test_cancelled_at_each_wait_gets_cancelled_error_and_leaves_no_worker(
    monkeypatch: pytest.MonkeyPatch, pool_size: int, code: str, at: str
) -> None:  # fmt: skip
    sb = sandbox(pool_size)
    spawns = Spawns(sb, monkeypatch)
    pool = sb.pool()
    assert pool_size == 0 or pool.wait_ready(1, timeout=GUARD_S)
    sweep = Sweep(monkeypatch, at)

    async def main() -> tuple[bool, bool]:
        async with AsyncSandbox(sb) as asb:
            task = asyncio.create_task(asb.execute(ExecutionRequest(code=code, limits=LIMITS)))
            async with asyncio.timeout(GUARD_S):
                with pytest.raises(asyncio.CancelledError):
                    await task
            return task.cancelled(), await ended(sweep.handed)

    try:
        cancelled, handed_ended = run(main())
        assert sweep.fired, sweep.kinds  # the cancel was requested where asked
        assert cancelled and handed_ended
        # cold, cancelled at the hand-out: the worker started for it is destroyed by ``unless_cancelled``, unused
        assert len(sweep.handed) == (0 if (pool_size, at) == (0, "acquire") else 1) and spawns.started
        assert not left_alive(spawns, pool)
    finally:
        sb.close()


@pytest.mark.usefixtures("exit_on_loop")
def test_a_call_that_finished_before_cancel_keeps_its_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI9's case made deterministic: the program's answer and exit are in before the task first polls (the
    loop's thread was held up after sending it), so its first step runs the whole execution. ``cancel()`` then
    comes too late: it returns False, and the outcome stands (asyncio's contract; nothing was cancelled)."""
    sb = sandbox(1)
    pool = sb.pool()
    assert pool.wait_ready(1, timeout=GUARD_S)
    sweep = Sweep(monkeypatch, None)
    held_up = hold_up_after_send(monkeypatch, sweep)

    async def main() -> tuple[ExecutionOutcome, bool, bool]:
        async with AsyncSandbox(sb) as asb:
            task = asyncio.create_task(asb.execute(ExecutionRequest(code="return 1", limits=LIMITS)))
            await asyncio.sleep(0)  # the task's first step
            finished = task.done()
            accepted = task.cancel()
            return await task, finished, accepted

    try:
        outcome, finished, accepted = run(main())
        assert held_up, "the send was not held up"
        assert finished and not accepted
        assert outcome.ok and outcome.value == 1
        assert sweep.kinds[0] == "acquire" and sweep.kinds[-1] == "detach"
    finally:
        sb.close()


def hold_up_after_send(monkeypatch: pytest.MonkeyPatch, sweep: Sweep) -> list[bool]:
    """After the request is sent, block (as a loop thread that lost the GIL would) until the worker has
    answered and exited (its pidfd readable, the host reaping an adopted runner itself; or its zygote's report
    in): all the execution waits for is in before its first poll."""
    from sandforge.sandbox import exchange

    send = exchange.send_execute
    held: list[bool] = []

    def send_then_wait(*args: Any, **kwargs: Any) -> None:
        send(*args, **kwargs)
        worker = sweep.handed[-1]
        zygote = worker._zygote  # type: ignore[attr-defined]
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            with zygote._cond:
                pidfd = zygote._adopted.get(worker.pid)  # type: ignore[attr-defined]
                if worker.pid in zygote._exits or (pidfd is not None and wait_fd(pidfd, 0.0)):  # type: ignore[attr-defined]
                    held.append(True)
                    return
            time.sleep(0.002)

    monkeypatch.setattr(exchange, "send_execute", send_then_wait)
    return held


def test_a_call_waiting_for_the_pool_is_cancelled_and_its_worker_goes_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pool of one, held by a spinning call: a second call waits (no thread) and is cancelled there. The worker
    the pool starts for it is not lost: a third call gets it."""
    sb = sandbox(1)
    spawns = Spawns(sb, monkeypatch)
    pool = sb.pool()
    assert pool.wait_ready(1, timeout=GUARD_S)

    async def main() -> tuple[bool, ExecutionOutcome]:
        async with AsyncSandbox(sb) as asb:
            busy = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=Limits(timeout_s=60))))
            waiting = asyncio.create_task(asb.execute(ExecutionRequest(code="return 2", limits=LIMITS)))
            await asyncio.sleep(0)
            assert pool.stats["waited"] == 1
            accepted = waiting.cancel()
            async with asyncio.timeout(GUARD_S):
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                last = await asb.execute(ExecutionRequest(code="return 3", limits=LIMITS))
                busy.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await busy
            return accepted, last

    try:
        accepted, last = run(main())
        assert accepted and last.ok and last.value == 3
        assert not left_alive(spawns, pool)
    finally:
        sb.close()


def test_a_call_cancelled_in_the_iteration_its_worker_is_delivered_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's thread delivers a worker to a waiting call (``_deliver`` runs on the loop, the call's future
    now holds it) and the call is cancelled before it resumes: it raises CancelledError and the worker, which
    never ran anything, goes back to the ready set (it is not leaked, nor destroyed unused).

    No timing decides the order: the busy call takes the one warm worker before the other call starts, and
    the pool's refill is held back until that call waits, so its worker comes through ``_deliver``."""
    sb = sandbox(1)
    spawns = Spawns(sb, monkeypatch)
    pool = sb.pool()
    assert pool.wait_ready(1, timeout=GUARD_S)
    backend = sb._backend("subprocess")
    spawn = backend.spawn

    waited: list[bool] = []

    def after_a_call_waits(*args: Any, **kwargs: Any) -> Worker:
        deadline = time.monotonic() + GUARD_S
        while not (waited or pool._waiters) and time.monotonic() < deadline:
            time.sleep(0.005)
        waited.append(True)  # once: the later refills are not held
        return spawn(*args, **kwargs)

    monkeypatch.setattr(backend, "spawn", after_a_call_waits)
    tasks: list[asyncio.Task[ExecutionOutcome]] = []
    delivered: list[Worker] = []
    deliver = pool._deliver

    def deliver_then_cancel(waiter: asyncio.Future[Worker], worker: Worker) -> None:
        deliver(waiter, worker)
        if not delivered and waiter.done() and not waiter.cancelled():
            delivered.append(worker)
            tasks[0].cancel()  # same iteration: the call has its worker but has not resumed

    monkeypatch.setattr(pool, "_deliver", deliver_then_cancel)

    async def main() -> tuple[int, bool]:
        async with AsyncSandbox(sb) as asb:
            busy = asyncio.create_task(asb.execute(ExecutionRequest(code=SPIN, limits=Limits(timeout_s=60))))
            async with asyncio.timeout(GUARD_S):
                while pool.ready_count():  # the busy call has the warm worker (its refill waits for a waiter)
                    await asyncio.sleep(0.005)
                tasks.append(asyncio.create_task(asb.execute(ExecutionRequest(code="return 2", limits=LIMITS))))
                with pytest.raises(asyncio.CancelledError):
                    await tasks[0]
                ready = pool.ready_count()
                back = delivered[0] in list(pool._ready) and delivered[0].alive()
                busy.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await busy
            return ready, back

    try:
        ready, back = run(main())
        assert delivered and ready >= 1 and back
        assert not left_alive(spawns, pool)
    finally:
        sb.close()
