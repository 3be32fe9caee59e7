"""The lazy ``sandforge`` group lists its commands from a static table (so ``--help`` imports no command module);
this keeps that table equal to the modules: every ``runtime/cli/*_cmd.py`` is a listed command whose name and
short help are the table's."""

from __future__ import annotations

import importlib
from pathlib import Path

import click
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.cli.registry import COMMANDS, command_module

CLI_DIR = Path(__file__).resolve().parents[2] / "runtime" / "cli"


def test_every_command_module_is_in_the_table() -> None:
    modules = sorted(p.stem.removesuffix("_cmd") for p in CLI_DIR.glob("*_cmd.py"))
    assert modules == sorted(COMMANDS)


def test_each_summary_is_its_command_s_own_short_help() -> None:
    for name, summary in COMMANDS.items():
        command = importlib.import_module(command_module(name)).command
        assert isinstance(command, click.Command)
        assert command.name == name
        for limit in (45, 60, 200):
            assert click.Command(name, help=summary).get_short_help_str(limit) == command.get_short_help_str(limit)


def test_help_lists_every_command_with_its_summary() -> None:
    listed = CliRunner().invoke(main, ["--help"], terminal_width=200).output
    for name, summary in COMMANDS.items():
        assert f"  {name} " in listed and summary.split(";")[0].split(" (")[0][:40] in listed, name


def test_an_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2 and "No such command 'no-such-command'" in result.output


def test_the_version_is_pyproject_s() -> None:
    import tomllib

    import sandforge

    pyproject = tomllib.loads((CLI_DIR.parents[1] / "pyproject.toml").read_text())
    assert sandforge.__version__ == pyproject["project"]["version"]
    assert CliRunner().invoke(main, ["--version"]).output == f"sandforge {sandforge.__version__}\n"
