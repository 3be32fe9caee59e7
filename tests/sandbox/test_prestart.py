"""``Sandbox.prestart``: the subprocess zygote starts ahead of the first execution (``sandforge exec`` overlaps it
with its imports and policy pass, issue 39), is the one that execution uses, and leaves nothing behind when no
program runs (a refusal, an error before the run, a close right after the start)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.zygote import Zygote


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
        assert backend._prestarting is not None
        backend._prestarting.join(timeout=120)
        zygote = backend._zygotes[sb.config.limits]
        assert zygote.alive()  # started before any execution asked for it
        out = sb.execute(ExecutionRequest(code="return 1 + 1", limits=sb.config.limits))
        assert out.ok and out.value == 2
        assert list(backend._zygotes.values()) == [zygote]  # the execution forked from it, none other started
    finally:
        sb.close()
    assert not zygote.alive() and zygote.proc.poll() is not None
    assert set(_zygotes_alive()) <= before


def test_closing_right_after_prestart_leaves_no_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close`` waits for a start under way and ends what it started, even when no execution came (the start
    is held back so that ``close`` comes first: a close that did not wait would leave its zygote running)."""
    start = SubprocessBackend._zygote

    def late(self: SubprocessBackend, limits: Limits) -> Zygote | None:
        time.sleep(0.3)
        return start(self, limits)

    monkeypatch.setattr(SubprocessBackend, "_zygote", late)
    before = set(_zygotes_alive())
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=0))
    sb.prestart()
    backend = _backend(sb)
    thread = backend._prestarting
    sb.close()
    assert thread is not None
    thread.join(timeout=120)  # had close not waited, the zygote would come up now, after it
    assert set(_zygotes_alive()) <= before
    assert backend._zygotes == {}


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
