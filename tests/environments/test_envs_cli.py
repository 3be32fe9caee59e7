"""`sandforge envs list | show ID | build FILE | prune [ID...] [--apply] [--force] | remove ID... [--force]`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.environments.builder import TMP_PREFIX, EnvironmentStore
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


RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


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
    shown = json.loads(out)
    assert shown["spec"]["manifest"]["requirements"][0]["name"] == "python-dateutil"
    code, out = _cli(env, "envs", "list", "--json")
    listed = json.loads(out)["environments"][0]
    # one timestamp format in every JSON output (issue 21): RFC 3339, UTC
    assert listed["created_at"] == shown["created_at"] and RFC3339.fullmatch(shown["created_at"])


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
    _persist(env["SANDFORGE_STATE_DIR"], PROGRAM, env_id)
    code, out = _cli(env, "envs", "prune", "--apply")
    assert "keep" in out and "used by a persisted artifact" in out
    assert (envs / env_id).is_dir() and not (envs / f"{TMP_PREFIX}{env_id}-killed").exists()
    code, out = _cli(env, "envs", "prune", "--apply", "--force", "--json")
    assert json.loads(out)["removed"] == 1
    assert not any(envs.iterdir())
    code, out = _cli(env, "envs", "list")
    assert out.strip() == "no environments"


def _persist(state_dir: str, code: str, env_id: str | None, *, method: str = "year") -> None:
    """A persisted artifact ``dates.<method>`` that runs with environment ``env_id`` (its stored spec)."""
    store = ToolStore(state_dir)
    cacheable = Cacheability(
        cacheable=True, reason=CacheabilityReason.DELEGATED_CONTRACT, detail="test", input_sensitive=False
    )
    spec = None
    if env_id is not None:
        record = EnvironmentStore(Path(state_dir) / "environments").record(env_id)
        assert record is not None
        spec = record.spec
    candidate = ArtifactCandidate(
        role="dates", method_name=method, code=code, runtime_version="t", cacheability=cacheable, environment=spec,
        dependencies=spec.manifest.lines() if spec is not None else [],
    )  # fmt: skip
    store.save_artifact(candidate, source=ProgramSource.GENERATED)


def _two_environments_of_one_manifest(env: dict[str, str], wheelhouse: Path, tmp_path: Path) -> tuple[str, str]:
    """The same manifest under two source policies (two wheelhouse paths): two environments, two ids."""
    other = tmp_path / "other-layer"
    other.mkdir()
    (other / "deps.yaml").write_text(f"dependencies:\n  source: offline\n  wheelhouse: {wheelhouse}\n")
    ids = []
    for layer in (env["LAYER"], str(other)):
        code, out = _cli(env, "envs", "build", env["PROG"], "--policy", layer, "--json")
        assert code == 0, out
        ids.append(json.loads(out)["env_id"])
    assert ids[0] != ids[1]
    return ids[0], ids[1]


def test_prune_keys_on_the_environment_ids_artifacts_store_not_on_their_manifests(
    env: dict[str, str], wheelhouse: Path, tmp_path: Path
) -> None:
    used, same_manifest = _two_environments_of_one_manifest(env, wheelhouse, tmp_path)
    _persist(env["SANDFORGE_STATE_DIR"], PROGRAM, used)
    code, out = _cli(env, "envs", "prune", "--json")
    entries = {e["name"]: e for e in json.loads(out)["entries"]}
    assert entries[used]["kept"] and entries[used]["used_by"] == ["dates.year"]
    assert not entries[same_manifest]["kept"] and entries[same_manifest]["why"] == "unused"
    code, out = _cli(env, "envs", "prune", "--apply")
    envs = Path(env["SANDFORGE_STATE_DIR"]) / "environments" / "envs"
    assert (envs / used).is_dir() and not (envs / same_manifest).exists()
    code, out = _cli(env, "envs", "show", used)
    assert code == 0 and "used by    dates.year" in out
    code, out = _cli(env, "envs", "show", used, "--json")
    assert json.loads(out)["used_by"] == ["dates.year"]


def test_prune_and_remove_by_id_or_prefix(env: dict[str, str], wheelhouse: Path, tmp_path: Path) -> None:
    used, unused = _two_environments_of_one_manifest(env, wheelhouse, tmp_path)
    _persist(env["SANDFORGE_STATE_DIR"], PROGRAM, used)
    envs = Path(env["SANDFORGE_STATE_DIR"]) / "environments" / "envs"
    (envs / f"{TMP_PREFIX}{unused}-killed").mkdir()
    code, out = _cli(env, "envs", "prune", unused[:8], "--json")  # a dry run, of that one only
    plan = json.loads(out)
    assert code == 0 and not plan["applied"] and [e["name"] for e in plan["entries"]] == [unused]
    assert (envs / unused).is_dir()
    code, out = _cli(env, "envs", "show", unused[:6])
    assert code == 0 and f"environment {unused}" in out and "no persisted artifact" in out
    code, out = _cli(env, "envs", "remove", used)  # used: kept, exit 1
    assert code == 1 and "keep" in out and "dates.year" in out and (envs / used).is_dir()
    code, out = _cli(env, "envs", "remove", unused[:5], "--json")
    assert code == 0 and json.loads(out)["removed"] == 1 and not (envs / unused).exists()
    assert (envs / f"{TMP_PREFIX}{unused}-killed").is_dir()  # removing by id leaves other leftovers alone
    code, out = _cli(env, "envs", "remove", used, "--force")
    assert code == 0 and "removed" in out and not (envs / used).exists()


def test_ids_that_name_nothing_or_several_are_usage_errors(
    env: dict[str, str], wheelhouse: Path, tmp_path: Path
) -> None:
    first, _ = _two_environments_of_one_manifest(env, wheelhouse, tmp_path)
    for args in (("show", "abc"), ("show", "xyz!"), ("remove", "f" * 32), ("prune", "0" * 32), ("show", first + "0")):
        code, out = _cli(env, "envs", *args)
        assert code == 2 and "no ready environment" in out and "Traceback" not in out, (args, out)
    envs = Path(env["SANDFORGE_STATE_DIR"]) / "environments" / "envs"
    twin = first[:6] + ("0" if first[6] != "0" else "1") + first[7:]  # a ready environment sharing 6 digits
    shutil.copytree(envs / first, envs / twin)
    record = json.loads((envs / twin / "environment.json").read_text())
    (envs / twin / "environment.json").write_text(json.dumps({**record, "env_id": twin}))
    code, out = _cli(env, "envs", "show", first[:6])
    assert code == 2 and "names 2 environments" in out
    code, out = _cli(env, "envs", "show", first[:7])
    assert code == 0 and f"environment {first}" in out
    code, out = _cli(env, "envs", "remove")
    assert code == 2  # an id is required


@pytest.mark.docker
def test_build_for_a_backend_is_what_exec_on_that_backend_finds(env: dict[str, str], tmp_path: Path) -> None:
    """``envs build --backend docker`` builds for the image's interpreter, so ``exec --backend docker`` of the
    same program under the same policy is a cache hit on that very environment."""
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"], "--backend", "docker", "--json")
    assert code == 0, out
    built = json.loads(out)
    code, out = _cli(env, "envs", "show", built["env_id"], "--json")
    shown = json.loads(out)
    assert shown["compiled_by"], shown
    argv = ["exec", env["PROG"], "--policy", env["LAYER"], "--backend", "docker", "--json", "--timeout", "30",
            "--args", '["4 May 2023"]']  # fmt: skip
    code, out = _cli(env, *argv)
    ran = json.loads(out)
    assert code == 0 and ran["value"] == 2023, ran
    assert ran["metadata"]["env_id"] == built["env_id"] and ran["metadata"]["environment_cache_hit"] is True
    code, out = _cli(env, "envs", "build", env["PROG"], "--python", "python3", "--backend", "docker")
    assert code == 2 and "give one" in out


def test_a_build_shows_its_steps_and_json_stays_one_object(env: dict[str, str]) -> None:
    """Progress on long work (issue 21): off a terminal each step is a line on stderr; --json prints no step."""
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"])
    assert code == 0, out
    assert "resolving python-dateutil" in out and "package(s) into environment" in out and " built in " in out
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"])
    assert code == 0 and "resolving" not in out and "installing" not in out, out  # both cached: no step to show
    code, out = _cli(env, "envs", "build", env["PROG"], "--policy", env["LAYER"], "--json")
    assert code == 0 and json.loads(out)["environment_cache_hit"] is True  # nothing but the object
