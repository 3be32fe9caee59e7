"""Issue 39 item 3: the first run of a program that declares packages builds its environment, which takes
seconds to minutes: ``sandforge exec`` says so on standard error as it goes (the JSON on standard output stays
one object); a run that finds the environment built says nothing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sandforge.runtime.cli import main
from tests.environments.test_exec_environment import DATEUTIL, cli_env

__all__ = ["cli_env"]  # the fixture, shared with test_exec_environment


def _exec(cli_env: dict[str, str]) -> tuple[int, dict[str, object], str]:
    program = Path(cli_env["dir"]) / "prog.py"
    program.write_text(DATEUTIL)
    argv = ["exec", str(program), "--policy", cli_env["layer"], "--backend", "subprocess", "--json",
            "--args", '["5 March 2024"]']  # fmt: skip
    result = CliRunner().invoke(main, argv, env={"SANDFORGE_STATE_DIR": cli_env["state"]})
    return result.exit_code, json.loads(result.stdout), result.stderr


def test_exec_shows_a_first_build_on_stderr_and_nothing_once_built(cli_env: dict[str, str]) -> None:
    code, first, shown = _exec(cli_env)
    assert code == 0 and first["value"] == "2024-03-05T00:00:00", first
    lines = shown.splitlines()
    step = "sandforge: building the program's environment: "
    assert f"{step}resolving python-dateutil" in lines, shown
    assert any(line.startswith(f"{step}installing ") for line in lines), shown
    code, again, shown = _exec(cli_env)
    assert code == 0 and again["metadata"]["environment_cache_hit"] is True, again  # type: ignore[index]
    assert "sandforge:" not in shown, shown
