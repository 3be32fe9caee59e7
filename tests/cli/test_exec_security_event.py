"""Issue 36: ``sandforge exec`` shows a run's security event (the inner wall's, the tripwire's), in its JSON
object and in its text: one typed line, exit code 1, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.sandbox import seam
from tests.security_programs import (
    EVENT,
    SOURCE,
    TRIP_EVENT,
    TRIP_SOURCE,
    TRIPPING,
    TRIPWIRE_SEAM,
    VIOLATING,
    assert_policy_approves,
)


def test_exec_json_and_text_show_the_security_event(tmp_path: Path) -> None:
    assert_policy_approves()
    program = tmp_path / "violating.py"
    program.write_text(VIOLATING)
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 1}')
    runner = CliRunner()
    result = runner.invoke(main, ["exec", str(program), "--backend", "subprocess", "--json",
                                  "--context", str(ctx), "--commit"])  # fmt: skip
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["error_type"] == "sandbox_violation"
    assert (data["security_event"]["source"], data["security_event"]["event"]) == (SOURCE, EVENT)
    assert "update_wrapper" in data["security_event"]["detail"]
    assert json.loads(ctx.read_text()) == {"n": 1}  # --commit wrote nothing
    text = runner.invoke(main, ["exec", str(program), "--backend", "subprocess"])
    assert text.exit_code == 1
    assert f"security event: {SOURCE} {EVENT}" in text.stderr


def test_exec_json_without_a_security_event_says_null(tmp_path: Path) -> None:
    program = tmp_path / "raises.py"
    program.write_text("raise ValueError('plain')\n")
    result = CliRunner().invoke(main, ["exec", str(program), "--backend", "subprocess", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["security_event"] is None


def test_exec_of_a_program_that_trips_is_one_typed_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seam, "ACTIVE", TRIPWIRE_SEAM)  # issue 36 item 1's fix reverted: the tripwire ends it
    program = tmp_path / "tripping.py"
    program.write_text(TRIPPING)
    runner = CliRunner()
    result = runner.invoke(main, ["exec", str(program), "--backend", "subprocess", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["error_type"] == "sandbox_violation"
    assert (data["security_event"]["source"], data["security_event"]["event"]) == (TRIP_SOURCE, TRIP_EVENT)
    assert "Traceback" not in result.output and "__import__" not in result.stdout
    text = runner.invoke(main, ["exec", str(program), "--backend", "subprocess"])
    assert text.exit_code == 1
    assert "Traceback" not in text.output
    errors = [line for line in text.stderr.splitlines() if "sandbox_violation" in line]
    assert len(errors) == 1 and "audit event 'compile'" in errors[0], text.stderr
    assert f"security event: {TRIP_SOURCE} {TRIP_EVENT}" in text.stderr
