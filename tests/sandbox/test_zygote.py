"""Subprocess launch modes: forked from the zygote (default) or started directly, same guarantees."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
def test_both_launch_modes_verify_every_protection(zygote: bool) -> None:
    with Sandbox(SandboxConfig(pool_size=0, zygote=zygote)) as sb:
        out = sb.execute(ExecutionRequest(code="context['x'] = 1\nreturn 2"))
    assert out.ok and out.context == {"x": 1}
    if os.geteuid() == 0:
        assert all(out.protections.values()), out.protections


def test_zygote_children_are_fresh_processes() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0))
    try:
        limits = Limits()
        workers = [backend.spawn(limits) for _ in range(3)]
        assert len({w.pid for w in workers}) == 3
        for w in workers:
            assert w.execute(ExecutionRequest(code="return 1", limits=limits), None).ok
            assert not w.alive()
    finally:
        backend.close()


def test_zygote_reaps_children_and_reports_host_usage() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0))
    try:
        limits = Limits(memory_mb=256)
        for _ in range(5):
            w = backend.spawn(limits)
            out = w.execute(ExecutionRequest(code="x = bytearray(48 * 1024 * 1024)\nreturn 1", limits=limits), None)
            assert out.ok and out.usage.source == "host" and out.usage.peak_memory_mb >= 48
        zygote = backend._zygotes[limits]
        zombies = [c for c in psutil.Process(zygote.proc.pid).children() if c.status() == psutil.STATUS_ZOMBIE]
        assert zombies == []
    finally:
        backend.close()


def test_a_dead_zygote_is_replaced() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0))
    try:
        limits = Limits()
        backend.spawn(limits).destroy()
        first = backend._zygotes[limits]
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=5)
        worker = backend.spawn(limits)
        assert worker.execute(ExecutionRequest(code="return 'after'", limits=limits), None).value == "after"
        assert backend._zygotes[limits] is not first
    finally:
        backend.close()


def test_timeout_kills_a_zygote_child() -> None:
    with Sandbox(SandboxConfig(pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="while True:\n    pass", limits=Limits(timeout_s=1)))
        assert out.error_type == "timeout"
        assert sb.execute(ExecutionRequest(code="return 1", limits=Limits(timeout_s=1))).ok


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
def test_missing_required_protection_refuses_to_run(monkeypatch: pytest.MonkeyPatch, zygote: bool) -> None:
    """As on a machine without libseccomp: the worker comes up without a filter, and the host notices."""
    from sandforge.sandbox import seccomp

    monkeypatch.setattr(seccomp, "compiled_filter", lambda: None)
    with Sandbox(SandboxConfig(pool_size=0, zygote=zygote)) as sb:
        refused = sb.execute(ExecutionRequest(code="return 1"))
    assert refused.error_type == "sandbox_unavailable" and not refused.retriable
    assert "seccomp" in (refused.error_message or "")

    with Sandbox(SandboxConfig(pool_size=0, zygote=zygote, required_protections=())) as sb:
        allowed = sb.execute(ExecutionRequest(code="return 1"))
    assert allowed.ok and allowed.protections["seccomp"] is False


def test_a_warm_execution_leaves_its_pool_full_again() -> None:
    """The sync API defers a taken worker's replacement until the execution has answered (``WarmPool.acquire``):
    the deferred wake-up is run when ``execute`` returns, so the pool refills and no wake-up stays owed."""
    with Sandbox(SandboxConfig(pool_size=2)) as sb:
        pool = sb.pool()
        assert pool.wait_ready(2, timeout=60)
        for _ in range(3):
            out = sb.execute(ExecutionRequest(code="return 1 + 1"))
            assert out.ok and out.value == 2, out.error_message
            assert sb._owed.refills == []
            assert pool.wait_ready(2, timeout=60)
        assert pool.stats["cold_starts"] == 0
