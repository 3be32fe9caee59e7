"""`--policy` means the same on every command (issue 23): a directory or a single YAML file, repeatable, and
`--no-default` where the command can run without the default layer. One helper (runtime/cli/common.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.cli.common import load_policy_option, policy_options
from sandforge.runtime.errors import ConfigError, UsageError

# The default policy refuses this with a rule (dynamic_class_creation); a bare policy lets it reach the
# sandbox, whose own type() refuses it at run time: the two outcomes tell which policy ran.
DYNAMIC_CLASS = 'v = type("A", (), {})\nreturn 1\n'
STRICT_RULE = """\
rules:
  - id: no_math
    description: Imports of math.
    rationale: For the test.
    message: "{module} is refused here"
    required_correction: Do not import {module}.
    match: {kind: import, modules: [math]}
    examples: {trigger: [import math], clean: [import json]}
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "bare": tmp_path / "bare.yaml",
        "strict": tmp_path / "strict.yaml",
        "dynamic": tmp_path / "dynamic.py",
        "math": tmp_path / "math.py",
    }
    paths["bare"].write_text("policy: {name: bare}\n")
    paths["strict"].write_text(STRICT_RULE)
    paths["dynamic"].write_text(DYNAMIC_CLASS)
    paths["math"].write_text("import math\nreturn math.floor(2.5)\n")
    return paths


def _exec(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["exec", "--backend", "subprocess", "--json", *args])
    assert result.exit_code in (0, 1, 3, 4), result.output  # 3/4: rejected by the policy (runtime/cli/exits.py)
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_exec_takes_a_single_policy_file(files: dict[str, Path]) -> None:
    without = _exec(str(files["math"]))
    assert without["status"] == "ok"
    refused = _exec("--policy", str(files["strict"]), str(files["math"]))
    assert refused["error_type"] == "guardrail_violation"
    assert "no_math" in str(refused["error_message"])


def test_exec_no_default_runs_without_the_default_layer(files: dict[str, Path]) -> None:
    layered = _exec("--policy", str(files["bare"]), str(files["dynamic"]))
    assert layered["error_type"] == "guardrail_violation"  # the default layer is underneath
    assert "dynamic_class_creation" in str(layered["error_message"])
    alone = _exec("--no-default", "--policy", str(files["bare"]), str(files["dynamic"]))
    assert alone["error_type"] == "execution"  # it reached the sandbox, whose type() refused it
    assert "type() takes exactly one argument" in str(alone["error_message"])


def test_no_default_without_a_layer_is_a_usage_error(files: dict[str, Path]) -> None:
    result = CliRunner().invoke(main, ["exec", "--no-default", str(files["math"])])
    assert result.exit_code == 2
    assert "--no-default needs at least one --policy" in result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "--help"],
        ["chat", "--help"],
        ["mcp", "--help"],
        ["envs", "build", "--help"],
        ["tools", "health", "--help"],
        ["policy", "check", "--help"],
        ["policy", "list", "--help"],
        ["policy", "explain", "--help"],
    ],
)
def test_every_policy_command_has_the_same_flags(argv: list[str]) -> None:
    text = CliRunner().invoke(main, argv).output
    assert "--policy PATH" in text and "directory or YAML file" in " ".join(text.split())
    assert "--no-default" in text


def test_the_helper_layers_and_orders(files: dict[str, Path], tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    @click.command()
    @policy_options()
    def probe(policies: tuple[Path, ...], no_default: bool) -> None:
        seen["policy"] = load_policy_option(policies, no_default)

    result = CliRunner().invoke(probe, ["--policy", str(files["bare"]), "--policy", str(files["strict"])])
    assert result.exit_code == 0, result.output
    policy = seen["policy"]
    assert policy.layers[-2:] == (str(files["bare"]), str(files["strict"]))  # type: ignore[attr-defined]
    assert policy.rule("no_math") is not None and policy.rule("module_not_allowed") is not None  # type: ignore[attr-defined]
    with pytest.raises(UsageError):
        load_policy_option((), no_default=True)
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy_option((tmp_path / "missing",))


def test_the_helper_reads_an_environment_variable(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    @click.command()
    @policy_options(envvar="SANDFORGE_TEST_POLICY")
    def probe(policies: tuple[Path, ...], no_default: bool) -> None:
        seen["policies"] = policies

    monkeypatch.setenv("SANDFORGE_TEST_POLICY", f"{files['bare']}:{files['strict']}")
    assert CliRunner().invoke(probe, []).exit_code == 0
    assert seen["policies"] == (files["bare"], files["strict"])
