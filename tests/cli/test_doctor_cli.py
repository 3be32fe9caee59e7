"""`sandforge doctor` (issue 14.5): the exit status follows every backend asked for, the cold figure includes
the sandbox's start-up, and missing or waived protections are said out loud."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge import sandbox as sandbox_pkg
from sandforge.runtime.cli import main
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend, SubprocessWorker
from sandforge.sandbox.protocol import Limits

NO_NAMESPACES = Path(__file__).parent.parent / "sandbox" / "no_namespaces_runner.py"


def doctor(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["doctor", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_requested_backend_that_fails_makes_doctor_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default backend (subprocess) works; the one asked for cannot reach its engine."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code, out, _ = doctor("--backend", "docker")
    assert code == 6, out  # sandbox unavailable
    assert "FAIL docker" in out
    code, out, _ = doctor("--backend", "subprocess", "--backend", "docker", "--json")
    assert code == 6
    works = {r["backend"]: r["works"] for r in json.loads(out)["backends"]}
    assert works == {"subprocess": True, "docker": False}


def test_requested_backends_that_all_work_exit_zero() -> None:
    code, out, err = doctor("--backend", "subprocess", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["waived"] == [] and report["backends"][0]["works"]


def test_cold_figure_includes_the_sandbox_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start-up that takes at least 0.3 s shows in the cold figure, not in the execution figure."""
    real_spawn = SubprocessBackend.spawn

    def slow_spawn(self: SubprocessBackend, limits: Limits) -> SubprocessWorker:
        time.sleep(0.3)
        return real_spawn(self, limits)

    monkeypatch.setattr(SubprocessBackend, "spawn", slow_spawn)
    code, out, err = doctor("--backend", "subprocess", "--json")
    assert code == 0, err
    report = json.loads(out)["backends"][0]
    assert report["cold_ms"] >= 300 + report["execution_ms"], report


def test_missing_protections_fail_doctor_and_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_pkg, "make_backend", lambda name, cfg: SubprocessBackend(cfg, runner=NO_NAMESPACES))
    code, out, _ = doctor("--backend", "subprocess", "--json")
    assert code == 6
    report = json.loads(out)["backends"][0]
    assert not report["works"] and "net_namespace" in report["missing"] and "private_root" in report["missing"]
    assert report["protections"]["seccomp"] and not report["protections"]["net_namespace"]
    code, text, _ = doctor("--backend", "subprocess")
    assert code == 6
    assert "MISSING net_namespace  (required)" in text and "required protections missing" in text


def test_waived_protections_are_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_ALLOW_MISSING_PROTECTIONS", "net_namespace")
    code, out, _ = doctor("--backend", "subprocess")
    assert code == 0
    assert "WARNING: protections waived by configuration (not required): net_namespace" in out
    assert "net_namespace  (waived)" in out


def test_a_malformed_protection_setting_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_REQUIRE_PROTECTIONS", "seccomp,net_namspace")
    code, _, err = doctor("--backend", "subprocess")
    assert code == 2
    assert err.count("\n") == 1 and "unknown protection 'net_namspace'" in err


@pytest.mark.docker
def test_container_cold_figure_includes_the_container_start() -> None:
    code, out, err = doctor("--backend", "docker", "--json")
    assert code == 0, out + err
    report = json.loads(out)["backends"][0]
    assert report["works"], report
    assert all(report["protections"][p] for p in report["required"]), report
    assert report["cold_ms"] > report["execution_ms"] > 0, report


def test_exec_refuses_a_sandbox_missing_its_walls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 14.1 as a user meets it: `exec` no longer returns ok without the namespaces and private root."""
    monkeypatch.setattr(sandbox_pkg, "make_backend", lambda name, cfg: SubprocessBackend(cfg, runner=NO_NAMESPACES))
    program = tmp_path / "p.py"
    program.write_text("return 42\n")
    result = CliRunner().invoke(main, ["exec", str(program), "--json"])
    assert result.exit_code == 6  # the sandbox is unavailable (runtime/cli/exits.py)
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "error" and outcome["error_type"] == "sandbox_unavailable"
    assert "net_namespace" in outcome["metadata"]["protections_missing"]
    assert "required protections missing" in outcome["error_message"]


def test_doctor_shows_the_restrictedpython_release() -> None:
    from sandforge.sandbox import image

    code, out, err = doctor("--backend", "subprocess", "--json")
    assert code == 0, err
    assert json.loads(out)["restrictedpython"] == {
        "version": image.restrictedpython_version(),
        "minimum": image.RESTRICTEDPYTHON_MINIMUM,
        "advisory": None,
    }
    code, out, _ = doctor("--backend", "subprocess")
    assert f"RestrictedPython {image.restrictedpython_version()} (no published escapes)" in out


def test_a_restrictedpython_with_escapes_fails_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandforge.sandbox import image

    monkeypatch.setattr(image, "restrictedpython_version", lambda: "8.2")
    code, out, _ = doctor("--backend", "subprocess")
    assert code == 6, out
    assert "RestrictedPython 8.2 has published sandbox escapes" in out


def test_doctor_states_the_environment_zygote_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 item 3: the LRU bound on zygotes that pre-imported an environment, as configured (none where
    they cannot be confined: the CI's rootless run)."""
    monkeypatch.setenv("SANDFORGE_ENV_ZYGOTES_MAX", "3")
    code, out, err = doctor("--backend", "subprocess", "--json")
    assert code == 0, err
    confined = json.loads(out)["env_zygotes_unconfinable"] is None
    assert json.loads(out)["env_zygotes"] == {"max": 3 if confined else 0, "idle_s": 120.0}
    code, out, _ = doctor("--backend", "subprocess")
    shown = "at most 3" if confined else "off: they cannot be confined here"
    assert f"environment zygotes (subprocess, packages pre-imported): {shown}" in out
    monkeypatch.setenv("SANDFORGE_ENV_ZYGOTES_MAX", "0")
    code, out, _ = doctor("--backend", "subprocess")
    assert "environment zygotes (subprocess, packages pre-imported): off" in out


def test_doctor_states_environment_zygotes_on_by_default_and_confined_or_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39 item 3: on by default (two), each confined before it imports; where they cannot be confined
    (rootless), none, and doctor says why."""
    monkeypatch.delenv("SANDFORGE_ENV_ZYGOTES_MAX", raising=False)
    code, out, err = doctor("--backend", "subprocess", "--json")
    assert code == 0, err
    summary = json.loads(out)
    if summary["env_zygotes_unconfinable"] is None:
        assert summary["env_zygotes"]["max"] == 2
        code, out, _ = doctor("--backend", "subprocess")
        assert "at most 2, least recently used closed first" in out and "confined before it imports" in out
    else:
        assert summary["env_zygotes"]["max"] == 0
    from sandforge.runtime.cli import doctor_cmd

    monkeypatch.setattr(doctor_cmd, "_env_zygotes_off", lambda config: "rootless: no /proc of its own")
    code, out, _ = doctor("--backend", "subprocess")
    assert "packages pre-imported): off: they cannot be confined here (rootless: no /proc of its own)" in out
