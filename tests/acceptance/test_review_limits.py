"""Non-finite limits are refused by name (issue 14 item 4): ``--timeout nan`` once read as "should be less
than or equal to 3600", which sends the user looking for a number that is too large."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_timeout_is_one_line_naming_finiteness(tmp_path: Path, value: str) -> None:
    program = tmp_path / "p.py"
    program.write_text("return 1\n")
    result = CliRunner().invoke(main, ["exec", str(program), "--timeout", value])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == ["error: invalid --timeout: Input should be a finite number"], result.stderr
