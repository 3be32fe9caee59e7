"""Issue 19 without a model: ``sandforge exec`` (and ``POST /v1/exec``, the MCP exec tool, through the same
``runtime.agent.program_exec.execute_program``) prepares the environment a program declares, as the agent does:
manifest, policy, build or hit, read-only mount; every failure a typed outcome with its ErrorType."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.cli import main
from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.guardrails import Policy, default_policy
from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox
from tests.environments.helpers import WHEELHOUSE_ALLOW, offline_policy

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""
UNDECLARED = "from dateutil import parser\nreturn parser.parse(args[0]).year\n"
SOUPSIEVE_UNDER_BS4 = '# /// script\n# dependencies = ["beautifulsoup4"]\n# ///\nimport soupsieve\nreturn 1\n'
HTTP_CLIENT = '# /// script\n# dependencies = ["httpx"]\n# ///\nreturn 1\n'
CONFLICT = '# /// script\n# dependencies = ["six==1.16", "six==1.17"]\n# ///\nreturn 1\n'
UNRESOLVABLE = '# /// script\n# dependencies = ["six>=99"]\n# ///\nreturn 1\n'


#: exec's exit status for a program refused before it ran: 1 (an error outcome), or 3 where the exit codes of
#: issue 21 tell a recoverable policy rejection apart (the JSON's error_type is the precise answer)
REFUSED = (1, 3)


def _nothing_built(root: Path) -> bool:
    envs = root / "envs"
    return not envs.exists() or not any(not p.name.startswith(".") for p in envs.iterdir())


# --- the CLI (subprocess backend) -----------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, wheelhouse: Path) -> dict[str, str]:
    layer = tmp_path / "layer"
    layer.mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "source": "offline", "wheelhouse": str(wheelhouse)}
    (layer / "deps.yaml").write_text(json.dumps({"dependencies": section}))
    return {"state": str(tmp_path / "state"), "layer": str(layer), "dir": str(tmp_path)}


def _exec(cli_env: dict[str, str], code: str, *args: str) -> tuple[int, dict[str, object]]:
    program = Path(cli_env["dir"]) / "prog.py"
    program.write_text(code)
    argv = ["exec", str(program), "--policy", cli_env["layer"], "--backend", "subprocess", "--json", "--timeout", "30",
            *args]  # fmt: skip
    result = CliRunner().invoke(main, argv, env={"SANDFORGE_STATE_DIR": cli_env["state"]})
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


def test_exec_builds_the_declared_environment_mounts_it_and_hits_it_next_time(cli_env: dict[str, str]) -> None:
    code, first = _exec(cli_env, DATEUTIL, "--args", '["5 March 2024 10:00"]')
    assert code == 0 and first["value"] == "2024-03-05T10:00:00", first
    meta = first["metadata"]
    assert isinstance(meta, dict) and meta["environment_cache_hit"] is False and meta["env_install_ms"] > 0
    env_id = meta["env_id"]
    ready = Path(cli_env["state"]) / "environments" / "envs" / str(env_id) / "environment.json"
    assert ready.is_file()  # below the state directory, where `sandforge envs` finds it
    code, again = _exec(cli_env, DATEUTIL, "--args", '["7 March 2024"]')
    assert code == 0 and again["value"] == "2024-03-07T00:00:00", again
    meta = again["metadata"]
    assert isinstance(meta, dict) and meta["environment_cache_hit"] is True and meta["env_id"] == env_id
    assert "env_install_ms" not in meta
    listed = CliRunner().invoke(main, ["envs", "list"], env={"SANDFORGE_STATE_DIR": cli_env["state"]})
    assert listed.output.startswith(str(env_id))


def test_exec_an_undeclared_third_party_import_is_declare_it(cli_env: dict[str, str]) -> None:
    code, out = _exec(cli_env, UNDECLARED, "--args", '["5 March 2024"]')
    assert code in REFUSED and out["error_type"] == "guardrail_violation", out
    violations = out["metadata"]["violations"]  # type: ignore[index]
    assert [v["violation_type"] for v in violations] == ["undeclared_import"]
    assert "python-dateutil" in violations[0]["message"]
    assert _nothing_built(Path(cli_env["state"]) / "environments")


def test_exec_a_module_only_a_transitive_distribution_provides_must_be_declared(cli_env: dict[str, str]) -> None:
    code, out = _exec(cli_env, SOUPSIEVE_UNDER_BS4)
    assert code in REFUSED and out["error_type"] == "guardrail_violation", out
    violations = out["metadata"]["violations"]  # type: ignore[index]
    assert violations[0]["violation_type"] == "undeclared_import" and "soupsieve" in violations[0]["message"]
    assert not out["metadata"]["backend"]  # type: ignore[index]  # nothing ran


@pytest.mark.parametrize(
    ("program", "kind", "retriable"),
    [
        (HTTP_CLIENT, "dependency_policy_violation", False),
        (CONFLICT, "invalid_dependency_manifest", False),
        (UNRESOLVABLE, "dependency_resolution_failed", False),
    ],
)
def test_exec_environment_failures_are_their_error_type(
    cli_env: dict[str, str], program: str, kind: str, retriable: bool
) -> None:
    code, out = _exec(cli_env, program)
    assert code in REFUSED and out["error_type"] == kind and out["retriable"] is retriable, out
    meta = out["metadata"]
    assert isinstance(meta, dict) and meta["environment_failure"]["kind"] == kind and not meta["backend"]
    if kind == "dependency_policy_violation":  # the fix names what the policy allows
        assert "python-dateutil" in meta["violations"][0]["required_correction"]
    assert _nothing_built(Path(cli_env["state"]) / "environments")


def test_exec_a_refused_transitive_distribution_keeps_its_fix(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Declared names pass, the resolution pulls one the policy does not allow: refused before installing,
    the violation (naming it, listing what is allowed) in the outcome's metadata."""
    layer = Path(cli_env["layer"]) / "deps.yaml"
    section = json.loads(layer.read_text())["dependencies"]
    layer.write_text(json.dumps({"dependencies": {**section, "allow": ["python-dateutil"], "reset": True}}))
    code, out = _exec(cli_env, DATEUTIL, "--args", '["5 March 2024"]')
    assert code in REFUSED and out["error_type"] == "dependency_policy_violation", out
    meta = out["metadata"]
    assert isinstance(meta, dict) and meta["environment_failure"]["reason"] == "transitive"
    violation = meta["violations"][0]
    assert meta["verdict"] == "recoverable" and violation["violation_type"] == "dependency_policy_violation"
    assert "not in the policy's allow list" in violation["message"]
    assert "allowed distributions: python-dateutil" in violation["required_correction"]
    assert _nothing_built(Path(cli_env["state"]) / "environments")


def test_exec_text_output_names_the_kind_and_the_fix(cli_env: dict[str, str]) -> None:
    program = Path(cli_env["dir"]) / "prog.py"
    program.write_text(HTTP_CLIENT)
    argv = ["exec", str(program), "--policy", cli_env["layer"]]
    result = CliRunner().invoke(main, argv, env={"SANDFORGE_STATE_DIR": cli_env["state"]})
    assert result.exit_code in REFUSED
    assert "error [dependency_policy_violation]" in result.output and "fix:" in result.output


# --- execute_program on every backend -------------------------------------------------------------


def _policy(house: Path) -> Policy:
    return dataclasses.replace(default_policy(), dependencies=offline_policy(house))


@pytest.fixture
def environments(tmp_path: Path) -> Environments:
    return Environments(tmp_path / "environments")


def test_execute_program_imports_a_declared_package_on_every_backend(
    sandbox: Sandbox, wheelhouse: Path, environments: Environments
) -> None:
    policy = _policy(wheelhouse)
    request = ExecutionRequest(code=DATEUTIL, args=["5 March 2024 10:00"], limits=Limits(timeout_s=30))
    outcome, result = execute_program(sandbox, request, policy=policy, environments=environments)
    assert outcome.ok and outcome.value == "2024-03-05T10:00:00", outcome
    assert result is not None and result.verdict == "approved"
    record = environments.store.record(str(outcome.metadata["env_id"]))
    assert record is not None and outcome.metadata["environment_cache_hit"] is False
    assert record.spec.target == environments.target(sandbox, None)  # built for the backend's own interpreter
    again, _ = execute_program(sandbox, request, policy=policy, environments=environments)
    assert again.ok and again.metadata["environment_cache_hit"] is True, again


def test_execute_program_a_failed_install_is_retriable(sandbox: Sandbox, wheelhouse: Path, tmp_path: Path) -> None:
    broken = Environments(tmp_path / "e", store=EnvironmentStore(tmp_path / "e", uv=str(tmp_path / "no-uv")))
    outcome, _ = execute_program(sandbox, ExecutionRequest(code=DATEUTIL, args=["x"]), policy=_policy(wheelhouse),
                                 environments=broken)  # fmt: skip
    assert outcome.error_type is ErrorType.DEPENDENCY_INSTALL_FAILED and outcome.retriable, outcome
    assert not outcome.backend  # nothing ran


def _hold(lock: str, ready: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event) -> None:
    from filelock import FileLock

    with FileLock(lock):
        ready.set()
        done.wait(60)


@pytest.fixture
def held_build_lock(tmp_path: Path, wheelhouse: Path) -> Iterator[tuple[Environments, Policy]]:
    """Another process holds the build lock of the environment DATEUTIL needs (a build in progress)."""
    policy = _policy(wheelhouse)
    root = tmp_path / "environments"
    envs = Environments(root, store=EnvironmentStore(root, wait_s=0.2))
    probe_sandbox = Sandbox()
    target = envs.target(probe_sandbox, "subprocess")
    from sandforge.runtime.environments.manifest import manifest_of

    manifest = manifest_of(DATEUTIL)
    pins, _ = envs.store._resolution(manifest, target, policy.dependencies.sources, allowed=())
    from sandforge.runtime.environments.identity import EnvironmentSpec

    env_id = EnvironmentSpec(target=target, manifest=manifest, pins=pins, source=policy.dependencies.sources).env_id
    envs.store.locks.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(envs.store.locks / f"{env_id}.lock"), ready, done))
    holder.start()
    try:
        assert ready.wait(60)
        yield envs, policy
    finally:
        done.set()
        holder.join(60)
        probe_sandbox.close()


def test_execute_program_a_build_in_progress_past_the_wait_is_environment_preparing(
    held_build_lock: tuple[Environments, Policy],
) -> None:
    envs, policy = held_build_lock
    with Sandbox() as sb:
        outcome, _ = execute_program(sb, ExecutionRequest(code=DATEUTIL, args=["x"]), policy=policy,
                                     backend="subprocess", environments=envs)  # fmt: skip
    assert outcome.error_type is ErrorType.ENVIRONMENT_PREPARING and outcome.retriable, outcome
    assert outcome.metadata["environment_failure"]["kind"] == "environment_preparing"


# --- POST /v1/exec (a real `sandforge serve`) -----------------------------------------------------


@pytest.mark.slow
def test_post_v1_exec_prepares_the_declared_environment(tmp_path: Path, wheelhouse: Path) -> None:
    from tests.service.serverproc import start_server

    layer = tmp_path / "layer"
    layer.mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "source": "offline", "wheelhouse": str(wheelhouse)}
    (layer / "deps.yaml").write_text(json.dumps({"dependencies": section}))
    config = {"state_dir": "state", "tenants": [{"name": "alpha", "policy": [str(layer)]}]}
    server = start_server(tmp_path / "serve", config, env={"SANDFORGE_STATE_DIR": str(tmp_path / "host-state")})
    try:
        with server.client("alpha") as client:
            first = client.post("/v1/exec", json={"code": DATEUTIL, "args": ["5 March 2024"], "timeout_s": 30}).json()
            again = client.post("/v1/exec", json={"code": DATEUTIL, "args": ["6 March 2024"], "timeout_s": 30}).json()
            refused = client.post("/v1/exec", json={"code": HTTP_CLIENT}).json()
    finally:
        server.stop()
    assert first["status"] == "ok" and first["value"] == "2024-03-05T00:00:00", first
    assert first["metadata"]["environment_cache_hit"] is False
    assert again["metadata"]["environment_cache_hit"] is True
    assert again["metadata"]["env_id"] == first["metadata"]["env_id"]
    assert refused["error_type"] == "dependency_policy_violation" and refused["retriable"] is False, refused


def test_default_environments_follow_the_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose SANDFORGE_STATE_DIR changes (tests, an embedding caller) never builds into the old one."""
    from sandforge.runtime.agent.environment import default_environments

    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "one"))
    first = default_environments()
    assert default_environments() is first and first.store.root == tmp_path / "one" / "environments"
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "two"))
    assert default_environments().store.root == tmp_path / "two" / "environments"
