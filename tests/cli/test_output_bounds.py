"""Output amplification (issue 13 item 8): compact JSON for `--json` and commits, bounded by the message
limit, with a clear one-line error and nothing written when over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import exec_cmd, main
from sandforge.runtime.errors import OutputTooLargeError
from sandforge.runtime.files import encode_compact
from sandforge.sandbox import Limits, SandboxConfig

DEEP = "v = 1\nfor _ in range(150):\n    v = [v]\ncontext['deep'] = v\nreturn v\n"


def test_json_output_is_one_compact_line(tmp_path: Path) -> None:
    program = tmp_path / "deep.py"
    program.write_text(DEEP)
    result = CliRunner().invoke(main, ["exec", str(program), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1
    payload = json.loads(result.stdout)
    assert payload["status"] == "ok"
    assert len(result.stdout) < 2000  # indent=2 made this 150 levels deep value ~45 KB


def test_encode_compact_refuses_over_the_limit() -> None:
    assert encode_compact({"a": [1, 2]}, limit=100, what="x") == b'{"a":[1,2]}'
    with pytest.raises(OutputTooLargeError, match="over the message limit of 10 bytes") as info:
        encode_compact({"a": "x" * 20}, limit=10, what="the new context")
    assert info.value.exit_code == 1


def _small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SandboxConfig.from_env

    def from_env(**overrides: Any) -> SandboxConfig:
        config = real(**overrides)
        return config.model_copy(update={"limits": Limits(max_message_bytes=64 * 1024)})

    monkeypatch.setattr(exec_cmd.SandboxConfig, "from_env", staticmethod(from_env))


def test_a_context_over_the_message_limit_is_not_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _small_limits(monkeypatch)
    program = tmp_path / "grow.py"
    program.write_text("context['a'] = 'x' * 40000\ncontext['b'] = 'y' * 40000\nreturn 1\n")
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"keep": 1}')
    result = CliRunner().invoke(main, ["exec", str(program), "--context", str(ctx), "--commit"])
    assert result.exit_code == 5, result.output  # output_limit: a resource limit
    assert "limit is 65536" in result.stderr.splitlines()[0]  # the result frame is bounded first
    assert json.loads(ctx.read_text()) == {"keep": 1}


def test_the_commit_bound_is_the_message_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the sandbox's own bound, exec re-checks what it commits (the next run reads with that bound)."""
    monkeypatch.setattr(exec_cmd, "write_user_file", lambda *a: pytest.fail("must not write"))
    real = exec_cmd.encode_compact

    def tight(value: Any, *, limit: int, what: str, **kw: Any) -> bytes:
        return real(value, limit=min(limit, 10) if what == "the new context" else limit, what=what, **kw)

    monkeypatch.setattr(exec_cmd, "encode_compact", tight)
    program = tmp_path / "p.py"
    program.write_text("context['a'] = 'x' * 100\nreturn 1\n")
    ctx = tmp_path / "ctx.json"
    result = CliRunner().invoke(main, ["exec", str(program), "--context", str(ctx), "--commit"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "over the message limit" in lines[0] and "nothing was written" in lines[0]
    assert not ctx.exists()
