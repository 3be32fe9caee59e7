"""`sandforge policy ...`: exit codes, output formats, the example runner and rule pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from sandforge.runtime.cli.policy_cmd import EXIT_CODES

PROGRAMS = {
    "approved": "import json\nreturn json.loads(args[0])\n",
    "recoverable": "x = 1\ncls = ().__class__\n",
    "terminal": "import subprocess\nsubprocess.run(['ls'])\n",
}


def run(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["policy", *args], input=stdin)


@pytest.fixture
def programs(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for verdict, source in PROGRAMS.items():
        paths[verdict] = tmp_path / f"{verdict}.py"
        paths[verdict].write_text(source)
    return paths


def test_exit_codes_are_distinct_and_documented() -> None:
    assert EXIT_CODES == {"approved": 0, "recoverable": 3, "terminal": 4}
    assert len(set(EXIT_CODES.values()) | {1, 2}) == 5


@pytest.mark.parametrize("verdict", list(PROGRAMS))
def test_check_exit_code_follows_the_verdict(programs: dict[str, Path], verdict: str) -> None:
    result = run("check", str(programs[verdict]))
    assert result.exit_code == EXIT_CODES[verdict], result.output
    assert f": {verdict} (" in result.output


def test_check_text_shows_source_excerpt_with_caret(programs: dict[str, Path]) -> None:
    result = run("check", str(programs["recoverable"]))
    name = str(programs["recoverable"])
    assert f"{name}:2:7: dunder_attribute [recoverable]" in result.output
    assert "2 | cls = ().__class__\n  |       ^^^^^^^^^^^^\n" in result.output
    assert "= fix: Do not access __class__." in result.output


def test_check_json(programs: dict[str, Path]) -> None:
    result = run("check", str(programs["terminal"]), "--format", "json")
    assert result.exit_code == 4
    payload = json.loads(result.output)
    assert payload["file"] == str(programs["terminal"])
    assert payload["verdict"] == "terminal"
    assert {v["violation_type"] for v in payload["violations"]} == {"forbidden_module", "capability_not_granted"}
    assert payload["capabilities"][0]["tag"] == "subprocess"
    assert payload["policy_fingerprint"].startswith("sha256:")


def test_check_sarif(programs: dict[str, Path]) -> None:
    result = run("check", str(programs["terminal"]), "--format", "sarif")
    log = json.loads(result.output)
    assert log["version"] == "2.1.0"
    run_ = log["runs"][0]
    rules = run_["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} == {"forbidden_module", "capability_not_granted"}
    first = run_["results"][0]
    assert rules[first["ruleIndex"]]["id"] == first["ruleId"]
    region = first["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"], region["snippet"]["text"]) == (1, 1, "import subprocess")
    assert {r["properties"]["classification"] for r in run_["results"]} == {"recoverable", "terminal"}
    assert run_["properties"]["verdict"] == "terminal"
    assert run_["columnKind"] == "unicodeCodePoints"


def test_check_reads_stdin_as_bytes() -> None:
    result = run("check", "-", stdin=b"x = '\xff'\n")
    assert result.exit_code == 3
    assert "<stdin>:1:1: invalid_code" in result.output


def test_check_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run("check", str(tmp_path / "missing.py"))
    assert result.exit_code == 2


def test_check_with_a_layer_that_grants(programs: dict[str, Path], tmp_path: Path) -> None:
    layer = tmp_path / "grant"
    layer.mkdir()
    (layer / "p.yaml").write_text("grant: [subprocess]\noverride:\n  forbidden_module:\n    enabled: false\n")
    assert run("check", str(programs["terminal"]), "--policy", str(layer)).exit_code == 0
    assert run("check", str(programs["terminal"]), "--policy", str(layer), "--no-default").exit_code == 2


def test_policy_test_passes_for_the_default_policy() -> None:
    result = run("test")
    assert result.exit_code == 0, result.output
    assert " 0 failed in " in result.output
    assert "F" not in result.output.splitlines()[0]


def test_policy_test_reports_failing_examples(tmp_path: Path) -> None:
    layer = tmp_path / "broken"
    layer.mkdir()
    (layer / "p.yaml").write_text(
        "override:\n"
        "  interactive_builtin:\n"
        "    examples:\n"
        "      trigger: ['x = 1']\n"
        "      clean: ['breakpoint()', 'return 1']\n"
    )
    result = run("test", str(layer), "-v")
    assert result.exit_code == 1
    assert "FAIL rule interactive_builtin trigger[0]" in result.output
    assert "FAIL rule interactive_builtin clean[0]" in result.output
    assert "PASS rule interactive_builtin clean[1]" in result.output
    assert "did not trigger (found: nothing)" in result.output
    assert "triggered: line 1: breakpoint() needs an interactive terminal" in result.output
    assert " passed, 2 failed in " in result.output


def test_explain_rule_page() -> None:
    result = run("explain", "dunder_attribute")
    assert result.exit_code == 0
    page = result.output
    for heading in ("# dunder_attribute (recoverable)", "## What it does", "## Why is this bad?", "## Example",
                    "## Use instead"):  # fmt: skip
        assert heading in page
    assert "().__class__.__base__.__subclasses__()" in page
    assert "Matches attributes named __*__ (except __name__, __qualname__, __doc__, __module__)." in page


def test_explain_plugin_rule_includes_its_docstring() -> None:
    page = run("explain", "delegated_tool_mutation").output
    assert "Assigning, replacing or deleting attributes of an object returned by" in page


def test_explain_capability_and_engine_types() -> None:
    assert "# capability http_fetch - NOT granted" in run("explain", "http_fetch").output
    assert "# invalid_code (recoverable)" in run("explain", "invalid_code").output


def test_explain_unknown_rule_suggests() -> None:
    result = run("explain", "dunder_atribute")
    assert result.exit_code == 2
    assert "did you mean dunder_attribute" in result.stderr


def test_list_and_schema() -> None:
    listing = run("list").output
    lines = {words[0]: words[1] for words in map(str.split, listing.splitlines()[2:]) if len(words) > 2}
    assert lines["capability_not_granted"] == "terminal"
    assert lines["dunder_attribute"] == "recoverable"
    assert (lines["http_fetch"], lines["json_parse"]) == ("denied", "granted")
    schema = json.loads(run("schema").output)
    assert schema["title"] == "sandforge guardrail policy file"
