"""The configuration file (issue 21): sandforge.toml or [tool.sandforge], every SANDFORGE_* variable, the
environment over the file, typed errors naming the file and key, refused when others could have written it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandforge.runtime.cli.settings import BY_KEY, ENV_ONLY, SETTINGS, apply_config, find_config
from sandforge.runtime.errors import ConfigError

SANDFORGE = Path(sys.executable).parent / "sandforge"
REPO = Path(__file__).resolve().parents[2]
TEST_ONLY = {"SANDFORGE_REQUIRE_DOCKER", "SANDFORGE_TEST_WHEELHOUSE", "SANDFORGE_REQUIRE_WHEELHOUSE"}


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDFORGE_")}
    return subprocess.run([str(SANDFORGE), *args], cwd=cwd, env={**clean, **(env or {})}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def settings_of(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str | None]]:
    assert done.returncode == 0, done.stderr
    return {row["key"]: row for row in json.loads(done.stdout)["settings"]}


def test_sandforge_toml_sets_variables_and_the_environment_wins(tmp_path: Path) -> None:
    (tmp_path / "sandforge.toml").write_text('backend = "docker"\npool_size = 4\notel = false\nstate_dir = "st"\n')
    deeper = tmp_path / "a" / "b"
    deeper.mkdir(parents=True)
    shown = settings_of(run(deeper, "config", "--json"))  # found from a subdirectory, upwards
    assert (shown["backend"]["value"], shown["backend"]["source"]) == ("docker", "file")
    assert shown["pool_size"]["value"] == "4" and shown["otel"]["value"] == "0"
    assert shown["state_dir"]["value"] == str(tmp_path / "st")  # relative to the file
    assert shown["call_log"]["source"] == "default"
    shown = settings_of(run(deeper, "config", "--json", env={"SANDFORGE_BACKEND": "subprocess"}))
    assert (shown["backend"]["value"], shown["backend"]["source"]) == ("subprocess", "environment")


def test_the_file_reaches_the_commands(tmp_path: Path) -> None:
    """A setting from the file changes what a command does: an unknown backend is refused by exec."""
    (tmp_path / "sandforge.toml").write_text('backend = "nosuch"\n')
    (tmp_path / "p.py").write_text("return 1\n")
    done = run(tmp_path, "exec", "p.py")
    assert done.returncode == 2 and "SANDFORGE_BACKEND" in done.stderr, done.stderr
    assert run(tmp_path, "exec", "p.py", env={"SANDFORGE_BACKEND": "subprocess"}).returncode == 0


def test_pyproject_tool_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.sandforge]\nbackend = "runc"\n')
    assert settings_of(run(tmp_path, "config", "--json"))["backend"]["value"] == "runc"


def test_explicit_config_flag(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.toml").write_text('chat_model = "m1"\n')
    shown = settings_of(run(tmp_path, "--config", str(tmp_path / "elsewhere.toml"), "config", "--json"))
    assert shown["chat_model"]["value"] == "m1"
    missing = run(tmp_path, "--config", str(tmp_path / "nope.toml"), "config")
    assert missing.returncode == 2 and "nope.toml" in missing.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('backnd = "docker"\n', "unknown setting(s) backnd"),
        ('pool_size = "four"\n', "pool_size must be an integer"),
        ("otel = 1\n", "otel must be true or false"),
        ("backend = \n", "not valid TOML"),
        ('require_protections = [1, 2]\n', "require_protections must be a string or a list of strings"),
    ],
)
def test_a_bad_file_is_a_usage_error_naming_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "sandforge.toml").write_text(text)
    done = run(tmp_path, "config", "--json")
    assert done.returncode == 2, done.stdout
    error = json.loads(done.stderr)["error"]
    assert needle in error["message"] and "sandforge.toml" in error["message"]


def test_a_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sandforge.toml"
    path.write_text('allow_missing_protections = "all"\n')
    path.chmod(0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        find_config(tmp_path)
    done = run(tmp_path, "doctor", "--backend", "subprocess")
    assert done.returncode == 2 and "refused" in done.stderr


def test_lists_become_comma_and_colon_separated(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    applied = apply_config(tmp_path / "sandforge.toml", {"require_protections": ["seccomp", "rlimits"],
                                                        "mcp_policy": ["a", "b"]}, env)  # fmt: skip
    assert sorted(applied) == ["mcp_policy", "require_protections"]
    assert env["SANDFORGE_REQUIRE_PROTECTIONS"] == "seccomp,rlimits"
    assert env["SANDFORGE_MCP_POLICY"] == f"{tmp_path / 'a'}:{tmp_path / 'b'}"


def test_every_variable_the_code_reads_is_a_setting_and_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    used: set[str] = set()
    for folder in ("runtime", "sandbox"):
        for path in (REPO / folder).rglob("*.py"):
            used |= set(re.findall(r"SANDFORGE_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    used.discard("SANDFORGE_TRACE")  # the prefix of the trace_* settings (SANDFORGE_TRACE_<FIELD>)
    known = {s.env for s in SETTINGS} | set(ENV_ONLY)
    assert used - known - TEST_ONLY == set(), "a SANDFORGE_* variable that is not a setting"
    for name in known:
        assert f"`{name}`" in readme, f"{name} is not in the README's table"
    assert BY_KEY["backend"].env == "SANDFORGE_BACKEND"


def test_a_bad_setting_names_the_variable_and_the_file_that_set_it(tmp_path: Path) -> None:
    (tmp_path / "sandforge.toml").write_text('backend = "nosuch"\n')
    (tmp_path / "p.py").write_text("return 1\n")
    done = run(tmp_path, "exec", "p.py")
    assert done.returncode == 2
    assert "invalid SANDFORGE_BACKEND" in done.stderr and f"(set in {tmp_path / 'sandforge.toml'})" in done.stderr
    (tmp_path / "sandforge.toml").unlink()
    done = run(tmp_path, "exec", "p.py", env={"SANDFORGE_BACKEND": "nosuch"})
    assert done.returncode == 2 and "invalid SANDFORGE_BACKEND" in done.stderr and "set in" not in done.stderr


def test_a_shared_pyproject_without_a_sandforge_table_is_passed_over(tmp_path: Path) -> None:
    """Only a file that configures something must be safe: a project's pyproject.toml that others may write but
    that has no [tool.sandforge] table neither configures nor blocks anything (the search goes on upwards)."""
    project = tmp_path / "pyproject.toml"
    project.write_text('[project]\nname = "x"\n')
    project.chmod(0o666)
    assert find_config(tmp_path) is None or find_config(tmp_path)[0] != project  # type: ignore[index]
    project.write_text('[project]\nname = "x"\n[tool.sandforge]\nallow_missing_protections = "all"\n')
    project.chmod(0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        find_config(tmp_path)
