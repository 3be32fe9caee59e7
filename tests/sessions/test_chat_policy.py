"""`sandforge chat --policy DIR`: the tools' programs run (and fetch) under the layered policy, checked up front."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sandforge.runtime.cli import main


def test_a_bad_policy_layer_is_one_error_line_before_the_chat_starts(tmp_path: Path) -> None:
    (tmp_path / "layer").mkdir()
    (tmp_path / "layer" / "p.yaml").write_text("grant: [nope_capability]\n")
    script = tmp_path / "chat.json"
    script.write_text(json.dumps({"turns": ["hi"]}))
    args = ["chat", "--scripted", str(script), "--policy", str(tmp_path / "layer"), "--state-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(main, args, input="hello\n")
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "nope_capability" in result.stderr
    assert "session" not in result.stdout


def test_a_granting_layer_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "layer").mkdir()
    (tmp_path / "layer" / "p.yaml").write_text('grant: [http_fetch]\negress:\n  allow: [{host: "feeds.example"}]\n')
    script = tmp_path / "chat.json"
    script.write_text(json.dumps({"turns": ["hi"]}))
    args = ["chat", "--scripted", str(script), "--policy", str(tmp_path / "layer"), "--state-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(main, args, input="hello\n")
    assert result.exit_code == 0, result.output
    assert "assistant> hi" in result.stdout
