"""A tenant's agent calls do not serialise on one lock (issue 20): calls of different roles run at once; calls
of one role take turns, commit only on success, and never lose an update, nested calls included."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandforge.runtime.agent.callgate import CallGate
from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest
from sandforge.runtime.service.tenants import standalone_tenant
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Sandbox, SandboxConfig

INCR = "context['n'] = context.get('n', 0) + 1\nreturn context['n']"
BROKEN = "context['n'] = 1000\nraise ValueError('no')"
VIA = "return tool('counter').incr().value"
WAIT_S = 60.0  # a barrier that is not reached within this fails the test (never a speed goal)


class MapProvider:
    """Writes each (role, method)'s program; with ``barrier``, every generation waits there first."""

    name = "map"

    def __init__(self, programs: dict[tuple[str, str], str], barrier: threading.Barrier | None = None) -> None:
        self.programs = programs
        self.barrier = barrier
        self.count = 0
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        with self._lock:
            self.count += 1
        if self.barrier is not None:
            self.barrier.wait(WAIT_S)  # BrokenBarrierError: the provider failed, the call's outcome says so
        return GeneratedProgram(code=self.programs[(request.role, request.method)])


@pytest.fixture(scope="module")
def sandbox() -> object:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=2))
    yield sb
    sb.close()


@pytest.fixture(params=["memory", "durable"])
def durable(request: pytest.FixtureRequest) -> bool:
    """Each rule holds for contexts kept in memory and for contexts kept in a state database (issue 37)."""
    return bool(request.param == "durable")


def _workspace(tmp_path: Path, provider: MapProvider, sandbox: Sandbox, durable: bool = False) -> Workspace:
    state_dir = tmp_path if durable else None
    return Workspace(provider=provider, sandbox=sandbox, store=ToolStore(tmp_path), log=False, state_dir=state_dir)


def test_calls_of_different_roles_run_at_once(tmp_path: Path, sandbox: Sandbox) -> None:
    # both generations must be in progress together to pass the barrier: with one lock per workspace the
    # second call would wait for the first, which waits at the barrier for the second (broken after WAIT_S)
    provider = MapProvider({("a", "incr"): INCR, ("b", "incr"): INCR}, threading.Barrier(2))
    ws = _workspace(tmp_path, provider, sandbox)
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda role: ws.call(role, "incr"), ["a", "b"]))
    assert all(o.ok and o.value == 1 for o in outcomes), outcomes
    assert ws.context("a") == {"n": 1} and ws.context("b") == {"n": 1}


def test_a_tenants_workspace_runs_two_roles_at_once(tmp_path: Path) -> None:
    rt = standalone_tenant("t", tmp_path, backend="subprocess")
    provider = MapProvider({("a", "incr"): INCR, ("b", "incr"): INCR}, threading.Barrier(2))
    rt._parts["provider"] = provider  # the tenant's own workspace, with a provider that proves concurrency
    try:
        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(lambda role: rt.workspace.call(role, "incr"), ["a", "b"]))
        assert all(o.ok for o in outcomes), outcomes
    finally:
        rt.close()


def test_one_role_commits_every_success_and_no_failure(tmp_path: Path, sandbox: Sandbox, durable: bool) -> None:
    provider = MapProvider({("counter", "incr"): INCR, ("counter", "broken"): BROKEN})
    ws = _workspace(tmp_path, provider, sandbox, durable)
    methods = ["incr", "broken"] * 6
    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda m: ws.call("counter", m), methods))
    values = sorted(o.value for o, m in zip(outcomes, methods, strict=True) if m == "incr")
    assert all(o.ok for o, m in zip(outcomes, methods, strict=True) if m == "incr"), outcomes
    assert not any(o.ok for o, m in zip(outcomes, methods, strict=True) if m == "broken")
    assert values == [1, 2, 3, 4, 5, 6]  # each success saw the one before it: no lost update
    assert ws.context("counter") == {"n": 6}  # and no failed call's 1000 was ever committed


def test_nested_writes_to_a_busy_role_lose_nothing(tmp_path: Path, sandbox: Sandbox, durable: bool) -> None:
    # 'via' calls counter.incr inside its own program, without counter's lock, while direct counter.incr
    # calls commit: a 'via' commit that would overwrite them conflicts and its call runs again, alone
    provider = MapProvider({("counter", "incr"): INCR, ("via", "bump"): VIA})
    ws = _workspace(tmp_path, provider, sandbox, durable)
    calls = [("via", "bump"), ("counter", "incr")] * 6
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda c: ws.call(*c), calls))
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
    assert ws.context("counter") == {"n": len(calls)}


def test_the_commit_check_refuses_a_stale_write(tmp_path: Path, sandbox: Sandbox, durable: bool) -> None:
    from sandforge.runtime.agent.state import CommitConflict, Transaction

    ws = _workspace(tmp_path, MapProvider({}), sandbox, durable)
    state = ws._state
    txn = Transaction(state)
    assert txn.context("r") == {}
    ws.set_context("r", {"n": 5})  # committed after txn read r
    txn.set_context("r", {"n": 1})
    with pytest.raises(CommitConflict) as info:
        txn.commit()
    assert info.value.roles == ["r"]
    assert ws.context("r") == {"n": 5}  # nothing of the stale attempt was kept


def test_the_gate_is_exclusive_and_fair() -> None:
    gate = CallGate()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def ordinary() -> None:
        with gate.shared("a"):
            inside.set()
            release.wait(WAIT_S)
            order.append("shared")

    def alone() -> None:
        with gate.exclusive():
            order.append("exclusive")

    first = threading.Thread(target=ordinary)
    first.start()
    assert inside.wait(WAIT_S)
    second = threading.Thread(target=alone)
    second.start()
    release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert order == ["shared", "exclusive"]  # the exclusive entry waited for the call in progress
