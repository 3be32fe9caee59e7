"""``execute_program_async`` (what ``POST /v1/exec`` awaits) answers as ``execute_program`` does, and never
validates cold or prepares an environment on the event loop's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.runtime.agent import program_exec
from sandforge.runtime.agent.program_exec import execute_program, execute_program_async, plans_quickly
from sandforge.runtime.gate import NotApproved, approve, execute_approved_async
from sandforge.runtime.guardrails import clear_cache, default_policy
from sandforge.sandbox import AsyncSandbox, ErrorType, ExecutionOutcome, ExecutionRequest, Sandbox, SandboxConfig

CONFLICT = '# /// script\n# dependencies = ["six==1.16", "six==1.17"]\n# ///\nreturn 1\n'
PROGRAMS = {
    "approved": ("return args[0] * 2", [21]),
    "refused by the policy": ("import os\nreturn os.getpid()", []),
    "not Python": ("return (", []),
    "an invalid manifest": (CONFLICT, []),
    "raises": ("raise ValueError('no')", []),
}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig.from_env(backend="subprocess", pool_size=1)) as sb:
        yield sb


def _summary(outcome: ExecutionOutcome) -> dict[str, Any]:
    meta = outcome.metadata
    return {
        "ok": outcome.ok, "value": outcome.value, "error_type": outcome.error_type, "retriable": outcome.retriable,
        "verdict": meta.get("verdict"), "violations": [v["violation_type"] for v in meta.get("violations", [])],
        "environment_failure": meta.get("environment_failure"),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_async_answers_as_sync(sandbox: Sandbox, name: str) -> None:
    code, args = PROGRAMS[name]
    policy = default_policy()
    request = ExecutionRequest(code=code, args=args)
    sync, sync_result = execute_program(sandbox, request, policy=policy)

    async def awaited() -> tuple[ExecutionOutcome, Any]:
        async with AsyncSandbox(sandbox) as asb:
            return await execute_program_async(asb, request, policy=policy)

    clear_cache()  # the async side validates cold too (on a thread)
    outcome, result = asyncio.run(awaited())
    assert _summary(outcome) == _summary(sync)
    assert (result is None) == (sync_result is None)
    if name == "approved":
        assert outcome.value == 42 and outcome.backend == "subprocess"


def test_plans_quickly_only_with_a_cached_verdict_and_no_environment() -> None:
    policy = default_policy()
    clear_cache()
    cold = ExecutionRequest(code="return 7")
    assert not plans_quickly(cold, policy)  # would validate: not on a loop
    approve(cold.code, policy)
    assert plans_quickly(cold, policy)  # a hash away
    declared = ExecutionRequest(code='# /// script\n# dependencies = ["six"]\n# ///\nreturn 1\n')
    approve(declared.code, policy)
    assert not plans_quickly(declared, policy)  # an environment to find or build: a blocking call
    assert plans_quickly(ExecutionRequest(code=CONFLICT), policy)  # refused at once, nothing to wait for


def test_cold_planning_runs_off_the_loop_thread(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = program_exec.approve

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(program_exec, "approve", spy)
    policy = default_policy()
    request = ExecutionRequest(code="return 'cold once'")

    async def twice() -> list[ExecutionOutcome]:
        async with AsyncSandbox(sandbox) as asb:
            first, _ = await execute_program_async(asb, request, policy=policy)
            second, _ = await execute_program_async(asb, request, policy=policy)
            return [first, second]

    clear_cache()
    outcomes = asyncio.run(twice())
    assert [o.value for o in outcomes] == ["cold once", "cold once"]
    loop_thread = threading.current_thread().name  # asyncio.run runs its loop on this thread
    assert seen[0] != loop_thread  # the cold validation: on a worker thread
    assert seen[1] == loop_thread  # the cached one: on the loop, no hop


def test_the_async_gate_runs_only_the_approved_code(sandbox: Sandbox) -> None:
    policy = default_policy()
    _, approval = approve("return 1", policy)
    assert approval is not None

    async def forged() -> ExecutionOutcome:
        async with AsyncSandbox(sandbox) as asb:
            return await execute_approved_async(asb, ExecutionRequest(code="import os\nreturn 1"), approval)

    with pytest.raises(NotApproved):
        asyncio.run(forged())


def test_a_program_refused_before_running_never_reaches_a_sandbox(sandbox: Sandbox) -> None:
    policy = default_policy()

    class Refusing:
        sandbox = None

        async def execute(self, *a: Any, **k: Any) -> ExecutionOutcome:
            raise AssertionError("a refused program reached the sandbox")

    outcome, _ = asyncio.run(execute_program_async(Refusing(), ExecutionRequest(code="import os"), policy=policy))  # type: ignore[arg-type]
    assert outcome.error_type == ErrorType.GUARDRAIL_VIOLATION


@pytest.mark.parametrize("code", ["return 3", '# /// script\n# dependencies = ["six"]\n# ///\nreturn 1\n', CONFLICT])
def test_the_manifest_is_read_once_per_awaited_execution(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """Where planning runs is decided from the manifest, and planning gets that same manifest: it is never
    parsed twice (a large program's header scan is on the request's path)."""
    reads: list[str] = []
    real = program_exec.manifest_for

    def counted(*a: Any, **k: Any) -> Any:
        reads.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(program_exec, "manifest_for", counted)
    policy = default_policy()

    class Refusing:
        sandbox = None

        async def execute(self, *a: Any, **k: Any) -> ExecutionOutcome:
            raise AssertionError("not reached")

    request = ExecutionRequest(code="import os\n" + code)  # refused: the six environment is never built here
    outcome, _ = asyncio.run(execute_program_async(Refusing(), request, policy=policy))  # type: ignore[arg-type]
    assert not outcome.ok
    assert len(reads) == 1
