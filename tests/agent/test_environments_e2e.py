"""Issue 19 in the lifecycle, end to end on real sandboxes: a program's manifest is checked against the policy,
its environment built from the wheelhouse (or found), mounted read-only, and the call log says which; an
undeclared third-party import is a recoverable "declare it"; each typed outcome takes its lane. Every test runs
on every backend (``sandbox`` from tests/conftest.py: subprocess, docker, gvisor, runc, runsc), each with the
environment built for that backend's own interpreter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sandforge.runtime.agent import CallLog, Workspace
from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.guardrails import Policy, default_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.scripted import ScriptItem
from sandforge.sandbox import Sandbox
from tests.environments.helpers import offline_policy, require_wheelhouse

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""
UNDECLARED = "from dateutil import parser\nreturn parser.parse(args[0]).isoformat()\n"
BS4_ONLY_SOUPSIEVE = """# /// script
# dependencies = ["beautifulsoup4"]
# ///
import soupsieve
return str(soupsieve.match)[:1]
"""
FORBIDDEN = """# /// script
# dependencies = ["numpy"]
# ///
import numpy
return 1
"""
HTTP_CLIENT = """# /// script
# dependencies = ["httpx"]
# ///
return 1
"""
BAD_MANIFEST = """# /// script
# dependencies = ["six==1.16", "six==1.17"]
# ///
return 1
"""
UNRESOLVABLE = """# /// script
# dependencies = ["six>=99"]
# ///
return 1
"""


@pytest.fixture(scope="module")
def house() -> Path:
    return require_wheelhouse()


def _policy(house: Path) -> Policy:
    return dataclasses.replace(default_policy(), dependencies=offline_policy(house))


class Run:
    def __init__(self, tmp_path: Path, sandbox: Sandbox, house: Path, environments: Environments) -> None:
        self.tmp_path, self.sandbox, self.policy, self.environments = tmp_path, sandbox, _policy(house), environments
        self.log = tmp_path / "calls.jsonl"

    def workspace(self, script: list[ScriptItem]) -> tuple[Workspace, ScriptedProvider]:
        provider = ScriptedProvider(script)
        ws = Workspace(provider=provider, sandbox=self.sandbox, policy=self.policy, log=CallLog(self.log),
                       environments=self.environments)  # fmt: skip
        return ws, provider

    def records(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def run(tmp_path: Path, sandbox: Sandbox, house: Path) -> Run:
    return Run(tmp_path, sandbox, house, Environments(tmp_path / "environments"))


def test_a_declared_package_is_built_mounted_and_imported_then_found(run: Run) -> None:
    ws, _ = run.workspace([DATEUTIL])
    first = ws.call("dates", "iso", "5 March 2024 10:00")
    assert first.ok, first
    assert first.value == "2024-03-05T10:00:00"
    built = run.records()[0]
    assert built["environment_cache_hit"] is False
    assert isinstance(built["env_id"], str) and len(built["env_id"]) == 32
    assert built["env_prepare_ms"] > 0 and built["env_install_ms"] > 0  # type: ignore[operator]
    ws2, _ = run.workspace([DATEUTIL])
    again = ws2.call("dates", "iso", "7 March 2024")
    assert again.ok and again.value == "2024-03-07T00:00:00", again
    hit = run.records()[-1]
    assert hit["environment_cache_hit"] is True and hit["env_id"] == built["env_id"]
    assert hit["env_resolve_ms"] is None and hit["env_install_ms"] is None


def test_an_undeclared_import_is_a_recoverable_declare_it(run: Run) -> None:
    ws, provider = run.workspace([UNDECLARED, DATEUTIL])
    outcome = ws.call("dates", "iso", "5 March 2024")
    assert outcome.ok and outcome.value == "2024-03-05T00:00:00", outcome
    feedback = provider.requests[1].feedback[-1]
    assert feedback.violation_type == "undeclared_import"
    assert "dateutil" in (feedback.violation_message or "") and "python-dateutil" in (feedback.violation_message or "")
    record = run.records()[-1]
    assert record["guardrail_recovery_attempts"] == 1 and record["attempts"] == 2
    system = provider.prompts[0].system  # the model was told what it may declare, and how
    assert "python-dateutil, six, soupsieve" in system and "# /// script" in system


def test_a_module_only_a_transitive_distribution_provides_must_be_declared(run: Run) -> None:
    ws, provider = run.workspace([BS4_ONLY_SOUPSIEVE])
    outcome = ws.call("soup", "name")
    assert not outcome.ok
    assert provider.requests[-1].feedback or outcome.error_type == "guardrail_retry_exhausted"
    failures = run.records()[-1]["attempt_failures"]
    assert isinstance(failures, list) and failures[0]["error_class"] == "undeclared_import"


@pytest.mark.parametrize(
    ("code", "kind"),
    [(FORBIDDEN, "dependency_policy_violation"), (HTTP_CLIENT, "dependency_policy_violation"),
     (BAD_MANIFEST, "invalid_dependency_manifest")],
)  # fmt: skip
def test_refused_manifests_are_feedback_and_nothing_is_built(run: Run, code: str, kind: str) -> None:
    ws, provider = run.workspace([code, "return 2\n"])
    outcome = ws.call("thing", "run")
    assert outcome.ok and outcome.value == 2, outcome
    feedback = provider.requests[1].feedback[-1]
    assert feedback.violation_type == kind
    if kind == "dependency_policy_violation":
        assert "python-dateutil" in (feedback.required_correction or "")  # what is allowed
    assert not (run.tmp_path / "environments" / "envs").exists() or not any(
        p for p in (run.tmp_path / "environments" / "envs").iterdir() if not p.name.startswith(".")
    )


def test_an_unresolvable_manifest_is_intrinsic(run: Run) -> None:
    ws, provider = run.workspace([UNRESOLVABLE, "return 3\n"])
    outcome = ws.call("thing", "run")
    assert outcome.ok and outcome.value == 3, outcome
    assert provider.requests[1].feedback[-1].error_type == "dependency_resolution_failed"


def test_a_failed_install_is_extrinsic_and_retriable(tmp_path: Path, sandbox: Sandbox, house: Path) -> None:
    broken = Environments(tmp_path / "environments", store=EnvironmentStore(tmp_path / "environments",
                                                                             uv=str(tmp_path / "no-uv")))  # fmt: skip
    r = Run(tmp_path, sandbox, house, broken)
    ws, provider = r.workspace([DATEUTIL])
    outcome = ws.call("dates", "iso", "5 March 2024")
    assert outcome.error_type == "dependency_install_failed", outcome
    assert outcome.retriable and outcome.metadata["failure_class"] == "extrinsic"
    assert provider.calls == 1  # never regenerated: the program is not at fault


def test_a_persisted_artifact_keeps_its_environment_and_rebuilds_it_on_a_fresh_machine(
    tmp_path: Path, sandbox: Sandbox, house: Path
) -> None:
    from sandforge.runtime.store import ToolStore

    first = Run(tmp_path, sandbox, house, Environments(tmp_path / "machine-1"))
    provider = ScriptedProvider([DATEUTIL])
    ws = Workspace(provider=provider, sandbox=sandbox, policy=first.policy, log=CallLog(first.log),
                   store=ToolStore(tmp_path / "state"), environments=first.environments)  # fmt: skip
    try:
        assert ws.call("dates", "iso", "5 March 2024").ok
    finally:
        ws.close()
    art = ToolStore(tmp_path / "state").lookup("dates", "iso").artifact
    assert art is not None and art.environment is not None
    assert art.dependencies == ["python-dateutil>=2.8"]
    built = first.records()[-1]
    assert art.environment.env_id == built["env_id"]

    fresh = ScriptedProvider([])  # nothing to generate: the stored program must run as it is
    ws = Workspace(provider=fresh, sandbox=sandbox, policy=first.policy, log=CallLog(first.log),
                   store=ToolStore(tmp_path / "state"), environments=Environments(tmp_path / "machine-2"))  # fmt: skip
    try:
        again = ws.call("dates", "iso", "6 March 2024")
    finally:
        ws.close()
    assert again.ok and again.value == "2024-03-06T00:00:00", again
    assert fresh.calls == 0
    rebuilt = first.records()[-1]
    assert rebuilt["program_source"] == "persisted"
    assert rebuilt["env_id"] == built["env_id"] and rebuilt["environment_cache_hit"] is False
    assert (tmp_path / "machine-2" / "envs" / str(built["env_id"]) / "environment.json").is_file()


def _policy_dir(tmp_path: Path, house: Path, *, block: tuple[str, ...] = ()) -> Path:
    from tests.environments.helpers import WHEELHOUSE_ALLOW

    layer = tmp_path / f"policy-{'-'.join(block) or 'ok'}"
    layer.mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "block": list(block), "source": "offline", "wheelhouse": str(house)}
    (layer / "policy.yaml").write_text(json.dumps({"dependencies": section}))
    return layer


def test_tools_health_reports_an_environment_that_cannot_be_built_and_the_artifact_is_repaired(
    tmp_path: Path, sandbox: Sandbox, house: Path
) -> None:
    from click.testing import CliRunner

    from sandforge.runtime.cli.tools_cmd import command
    from sandforge.runtime.guardrails import load_policy
    from sandforge.runtime.store import ToolStore

    state = tmp_path / "state"
    first = Run(tmp_path, sandbox, house, Environments(state / "environments"))
    ws = Workspace(provider=ScriptedProvider([DATEUTIL]), sandbox=sandbox, policy=first.policy,
                   log=CallLog(first.log), store=ToolStore(state), environments=first.environments)  # fmt: skip
    try:
        assert ws.call("dates", "iso", "5 March 2024").ok
    finally:
        ws.close()

    def health(*args: str) -> tuple[int, dict[str, object]]:
        result = CliRunner().invoke(command, ["--store", str(state), "health", "--json", *args])
        rows = json.loads(result.stdout)
        return result.exit_code, rows[0]["environment"]

    ok = _policy_dir(tmp_path, house)
    code, env = health("--policy", str(ok))
    assert (code, env["state"]) == (0, "ready"), env
    code, env = health()  # the shipped default resolves from the index: not the source it was stored for
    assert (code, env["state"]) == (1, "refused"), env
    blocked = _policy_dir(tmp_path, house, block=("python-dateutil",))  # the policy now refuses it
    code, env = health("--policy", str(blocked))
    assert (code, env["state"], env["kind"]) == (1, "refused", "dependency_policy_violation"), env
    assert "python-dateutil" in str(env["detail"])

    # on a machine without it, it is missing, and --build-envs proves it can still be built
    moved = state / "environments"
    moved.rename(tmp_path / "elsewhere")
    code, env = health("--policy", str(ok))
    assert (code, env["state"]) == (0, "missing"), env
    code, env = health("--policy", str(ok), "--build-envs")
    assert (code, env["state"]) == (0, "built"), env

    # run under the policy that refuses it: the stored program fails to prepare and is repaired
    policy = load_policy([*default_policy().sources, blocked])
    provider = ScriptedProvider(["return 'repaired'\n"])
    ws = Workspace(provider=provider, sandbox=sandbox, policy=policy, log=CallLog(first.log), store=ToolStore(state),
                   environments=first.environments)  # fmt: skip
    try:
        outcome = ws.call("dates", "iso", "6 March 2024")
    finally:
        ws.close()
    assert outcome.ok and outcome.value == "repaired", outcome
    record = first.records()[-1]
    assert record["attempt_failures"][0]["error_class"] == "dependency_policy_violation"  # type: ignore[index]
    assert provider.requests[0].repair is not None  # the stored code was handed back for repair
