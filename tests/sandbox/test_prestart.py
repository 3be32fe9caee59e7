"""``Sandbox.prestart``: the subprocess zygote starts ahead of the first execution (``sandforge exec`` overlaps it
with its imports and policy pass, issue 39), is the one that execution uses, and leaves nothing behind when no
program runs (a refusal, an error before the run, a close right after the start)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend


def _zygotes_alive() -> list[int]:
    """This process's descendants that are zygotes (a Zygote is a child of the process that starts it)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "--zygote" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def _backend(sb: Sandbox) -> SubprocessBackend:
    backend = sb._backends["subprocess"]
    assert isinstance(backend, SubprocessBackend)
    return backend


def test_the_first_execution_uses_the_prestarted_zygote() -> None:
    before = set(_zygotes_alive())
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=0))
    try:
        sb.prestart()
        backend = _backend(sb)
        zygote = backend._zygotes[sb.config.limits]  # started, its ready report not waited for
        assert zygote.alive()
        out = sb.execute(ExecutionRequest(code="return 1 + 1", limits=sb.config.limits))
        assert out.ok and out.value == 2
        assert list(backend._zygotes.values()) == [zygote]  # the execution forked from it, none other started
    finally:
        sb.close()
    assert not zygote.alive() and zygote.proc.poll() is not None
    assert set(_zygotes_alive()) <= before


def test_closing_right_after_prestart_leaves_no_zygote() -> None:
    """``close`` ends a zygote that has not reported ready yet, even when no execution came (a refusal)."""
    before = set(_zygotes_alive())
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=0))
    sb.prestart()
    zygote = _backend(sb)._zygotes[sb.config.limits]
    sb.close()
    assert zygote.proc.poll() is not None
    assert set(_zygotes_alive()) <= before


def test_a_prestarted_zygote_that_died_is_replaced() -> None:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        sb.prestart()
        backend = _backend(sb)
        first = backend._zygotes[sb.config.limits]
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
        out = sb.execute(ExecutionRequest(code="return 'after'", limits=sb.config.limits))
        assert out.ok and out.value == "after"
        assert backend._zygotes[sb.config.limits] is not first


def test_prestart_is_subprocess_only() -> None:
    """The container engines are reached only for an approved program: nothing is made ahead for them."""
    with Sandbox(SandboxConfig(backend="docker", pool_size=0)) as sb:
        sb.prestart()
        assert sb._backends == {}


def test_a_refused_program_leaves_no_zygote_behind(tmp_path: Path) -> None:
    """``sandforge exec`` starts the zygote before the policy pass; a refusal ends it before exec returns."""
    program = tmp_path / "escape.py"
    program.write_text("import os\nreturn os.getcwd()\n")
    before = set(_zygotes_alive())
    result = CliRunner().invoke(main, ["exec", str(program), "--backend", "subprocess", "--json"],
                                env={"SANDFORGE_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
    assert result.exit_code in (3, 4), result.stderr
    assert '"guardrail_violation"' in result.stdout
    assert set(_zygotes_alive()) <= before
