"""A node answers before it cleans up (issue 22, round 6): the worker of a finished execution is destroyed on the
host's clean-up threads after the outcome went back to the caller, never before it, and never left behind (a
closing host waits for them; steps that fail are cleaned up in place before their caller hears of it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sandforge.sandbox import ExecutionRequest, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessWorker
from sandforge.sandbox.cluster.host import SandboxHost
from sandforge.sandbox.cluster.wire import request_to_wire
from sandforge.sandbox.protocol import ErrorType, ExecutionOutcome
from sandforge.sandbox.steps import Blocking, Detach, Steps, run_steps, then_destroy

GATE_S = 5.0


def _outcome() -> ExecutionOutcome:
    return ExecutionOutcome.failure(ErrorType.EXECUTION, "stand-in")


def test_clean_up_runs_on_the_pool_after_the_outcome_and_other_effects_pass_through() -> None:
    gate, done, threads = threading.Event(), threading.Event(), []

    def destroy() -> None:
        threads.append(threading.current_thread().name)
        gate.wait(GATE_S)
        done.set()

    def steps() -> Steps[ExecutionOutcome]:
        first = yield Blocking(lambda: 41)
        try:
            yield Blocking(lambda: 1 / 0)
        except ZeroDivisionError:
            pass
        else:
            raise AssertionError("the driver's exception was not raised at the yield")
        yield Detach(destroy)
        outcome = _outcome()
        outcome.metadata["first"] = first + 1
        return outcome

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cleanup-test") as pool:
        outcome = run_steps(steps(), detach=pool.submit)
        assert outcome.metadata["first"] == 42
        assert not done.is_set(), "the outcome waited for the clean-up"
        gate.set()
    assert done.is_set()
    assert threads and threads[0].startswith("cleanup-test")


def test_steps_that_raise_are_destroyed_in_place_before_the_caller_hears() -> None:
    ran: list[str] = []

    def failing() -> Steps[ExecutionOutcome]:
        yield Blocking(lambda: None)
        raise RuntimeError("boom")

    with ThreadPoolExecutor(max_workers=1) as pool:
        with pytest.raises(RuntimeError, match="boom"):
            run_steps(then_destroy(failing(), lambda: ran.append("destroyed")), detach=pool.submit)
        assert ran == ["destroyed"]


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[int]]]:
    """Every subprocess worker's destroy waits for the gate (at most GATE_S); the pids destroyed so far."""
    gate, destroyed = threading.Event(), []
    original = SubprocessWorker.destroy

    def destroy(self: SubprocessWorker) -> None:
        gate.wait(GATE_S)
        original(self)
        destroyed.append(self.pid)

    monkeypatch.setattr(SubprocessWorker, "destroy", destroy)
    yield gate, destroyed
    gate.set()


def _call(request: ExecutionRequest) -> dict[str, Any]:
    message, blobs = request_to_wire(request)
    return {"id": "c1", "message": message, "backend": "subprocess", "blobs": blobs, "kinds": None}


def test_the_host_answers_before_the_worker_is_destroyed_and_close_waits_for_it(
    gated: tuple[threading.Event, list[int]],
) -> None:
    gate, destroyed = gated
    host = SandboxHost(SandboxConfig(backend="subprocess", pool_size=0).model_dump(mode="json"), [])
    closed = threading.Event()
    try:
        event = host.start(_call(ExecutionRequest(code="return 5")))
        assert event["kind"] == "done" and event["outcome"]["value"] == 5
        assert destroyed == [], "the node held the outcome back until its worker was destroyed"

        def close() -> None:
            host.close()
            closed.set()

        closer = threading.Thread(target=close)
        closer.start()
        assert not closed.wait(0.3), "the host closed with a finished execution's worker not yet destroyed"
    finally:
        gate.set()
    closer.join(GATE_S * 2)
    assert closed.is_set() and len(destroyed) == 1


def test_a_closing_host_destroys_in_place(gated: tuple[threading.Event, list[int]]) -> None:
    gate, destroyed = gated
    gate.set()
    host = SandboxHost(SandboxConfig(backend="subprocess", pool_size=0).model_dump(mode="json"), [])
    try:
        host.cleanup.shutdown()
        event = host.start(_call(ExecutionRequest(code="return 6")))
        assert event["outcome"]["value"] == 6
        assert len(destroyed) == 1, "a closing host left a finished execution's worker behind"
    finally:
        host.close()
