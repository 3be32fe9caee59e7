"""`sandforge envs list | show | build | prune [--apply] [--force]`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.environments.builder import TMP_PREFIX
from sandforge.runtime.store import ArtifactCandidate, Cacheability, CacheabilityReason, ProgramSource, ToolStore

PROGRAM = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).year
"""


@pytest.fixture
def env(tmp_path: Path, house: Path) -> dict[str, str]:
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "deps.yaml").write_text(f"dependencies:\n  source: offline\n  wheelhouse: {house}\n")
    (tmp_path / "prog.py").write_text(PROGRAM)
    return {"SANDFORGE_STATE_DIR": str(tmp_path / "state"), "LAYER": str(layer), "PROG": str(tmp_path / "prog.py")}


def _cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"SANDFORGE_STATE_DIR": env["SANDFORGE_STATE_DIR"]})
    return result.exit_code, result.output


def test_build_list_show_and_a_cache_hit(env: dict[str, str]) -> None:
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"], "--json")
    assert code == 0, out
    built = json.loads(out)
    assert built["ok"] and built["environment_cache_hit"] is False
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"])
    assert code == 0 and "ready (cached)" in out and built["env_id"] in out
    code, out = _cli(env, "envs", "list")
    assert code == 0 and out.startswith(built["env_id"]) and "python-dateutil==" in out
    code, out = _cli(env, "envs", "show", built["env_id"])
    assert code == 0 and "imports dateutil" in out and "the wheelhouse only" in out
    code, out = _cli(env, "envs", "show", built["env_id"], "--json")
    assert json.loads(out)["spec"]["manifest"]["requirements"][0]["name"] == "python-dateutil"


def test_build_refusals_are_typed_one_line_errors(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('# /// script\n# dependencies = ["requests"]\n# ///\nreturn 1\n')
    code, out = _cli(env, "envs", "build", str(bad), "--policy", env["LAYER"])
    assert code == 1 and "dependency_policy_violation" in out and "HTTP client" in out
    assert "Traceback" not in out
    bad.write_text('# /// script\n# dependencies = ["six==1", "six==2"]\n# ///\nreturn 1\n')
    code, out = _cli(env, "envs", "build", str(bad), "--policy", env["LAYER"], "--json")
    assert code == 2 and json.loads(out)["error_type"] == "invalid_dependency_manifest"
    bad.write_text("return 1\n")
    code, out = _cli(env, "envs", "build", str(bad))
    assert code == 2 and "invalid_dependency_manifest" in out and "declares no dependency" in out
    code, out = _cli(env, "envs", "show", "0" * 32)
    assert code == 2 and "no ready environment" in out


def test_prune_is_a_dry_run_keeps_what_artifacts_use_unless_forced(env: dict[str, str]) -> None:
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"], "--json")
    env_id = json.loads(out)["env_id"]
    envs = Path(env["SANDFORGE_STATE_DIR"]) / "environments" / "envs"
    (envs / f"{TMP_PREFIX}{env_id}-killed").mkdir()  # what a killed build leaves
    code, out = _cli(env, "envs", "prune")
    assert code == 0 and "would remove  leftover" in out and "would remove  environment" in out
    assert (envs / env_id).is_dir()  # a dry run
    _persist(env["SANDFORGE_STATE_DIR"], PROGRAM)
    code, out = _cli(env, "envs", "prune", "--apply")
    assert "keep" in out and "used by a persisted artifact" in out
    assert (envs / env_id).is_dir() and not (envs / f"{TMP_PREFIX}{env_id}-killed").exists()
    code, out = _cli(env, "envs", "prune", "--apply", "--force", "--json")
    assert json.loads(out)["removed"] == 1
    assert not any(envs.iterdir())
    code, out = _cli(env, "envs", "list")
    assert out.strip() == "no environments"


def _persist(state_dir: str, code: str) -> None:
    store = ToolStore(state_dir)
    cacheable = Cacheability(
        cacheable=True, reason=CacheabilityReason.DELEGATED_CONTRACT, detail="test", input_sensitive=False
    )
    candidate = ArtifactCandidate(
        role="dates", method_name="year", code=code, runtime_version="t", cacheability=cacheable
    )
    store.save_artifact(candidate, source=ProgramSource.GENERATED)
