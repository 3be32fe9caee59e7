"""Fail closed, and the same walls without root (issue 14.1).

- The default required protections are the documented wall; a worker that lacks any is refused with a
  typed ``MissingProtections`` naming what is missing and why; running weaker is an explicit waiver that
  every outcome shows.
- Without root, the subprocess sandbox builds every namespace and the private root from unprivileged user
  namespaces, and the host verifies them from outside. These run as uid 65534 in CI (``.ci/nonroot-tests``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandforge import sandbox as sandbox_pkg
from sandforge.sandbox import DEFAULT_REQUIRED, ExecutionRequest, Limits, MissingProtections, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend, verify_protections
from sandforge.sandbox.config import SandboxConfigError
from sandforge.sandbox.protections import ALWAYS_REQUIRED, PROTECTIONS, parse_list

HERE = Path(__file__).parent
NO_NAMESPACES = HERE / "no_namespaces_runner.py"
ESCAPED = HERE / "escaped_runner.py"
LIMITS = Limits(timeout_s=5, memory_mb=256, disk_mb=4, max_output_bytes=8192)
WALLS = ("private_root", "net_namespace", "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace")
ROOTLESS = os.geteuid() != 0
needs_rootless = pytest.mark.skipif(not ROOTLESS, reason="rootless mode; CI runs it as uid 65534 (.ci/nonroot-tests)")


# --- the required set --------------------------------------------------------------------------------------


def test_default_required_set_is_the_documented_wall() -> None:
    config = SandboxConfig()
    assert set(config.enforced_protections) == set(DEFAULT_REQUIRED) | set(ALWAYS_REQUIRED)
    for name in ("rlimits", "seccomp", "no_new_privs", "unprivileged_user", "audit_tripwire", *WALLS):
        assert name in config.enforced_protections, name
    assert config.waived_protections == ()


def test_protection_names_are_one_closed_set() -> None:
    with pytest.raises(ValueError, match="net_namespaces"):
        SandboxConfig(required_protections=("net_namespaces",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown protection 'bogus'"):
        parse_list("seccomp, bogus", "TEST")
    assert parse_list(" seccomp,rlimits ,seccomp,", "TEST") == ("seccomp", "rlimits")
    assert parse_list("none", "TEST") == () and parse_list("all", "TEST") == DEFAULT_REQUIRED
    assert set(DEFAULT_REQUIRED) <= set(PROTECTIONS)


def test_environment_waivers_are_explicit_and_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_ALLOW_MISSING_PROTECTIONS", "net_namespace,pid_namespace")
    config = SandboxConfig.from_env()
    assert "net_namespace" not in config.enforced_protections and "seccomp" in config.enforced_protections
    assert config.waived_protections == ("net_namespace", "pid_namespace")
    # the older variable still sets the exact required set; what it leaves out counts as waived
    monkeypatch.delenv("SANDFORGE_ALLOW_MISSING_PROTECTIONS")
    monkeypatch.setenv("SANDFORGE_REQUIRE_PROTECTIONS", "seccomp,rlimits")
    config = SandboxConfig.from_env()
    assert config.enforced_protections == ("seccomp", "rlimits", "audit_tripwire")  # the tripwire: never waived
    assert set(config.waived_protections) == set(DEFAULT_REQUIRED) - {"seccomp", "rlimits"}


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SANDFORGE_ALLOW_MISSING_PROTECTIONS", "pid_namspace"), ("SANDFORGE_REQUIRE_PROTECTIONS", "x"),
     ("SANDFORGE_POOL_SIZE", "two"), ("SANDFORGE_BACKEND", "chroot")],
)  # fmt: skip
def test_malformed_settings_are_one_typed_error(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SandboxConfigError) as info:
        SandboxConfig.from_env()
    assert "\n" not in str(info.value) and (variable in str(info.value) or "backend" in str(info.value))


# --- refusing a weaker sandbox -------------------------------------------------------------------------------


def test_a_sandbox_without_namespaces_is_refused_naming_what_is_missing() -> None:
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=NO_NAMESPACES)
    try:
        with pytest.raises(MissingProtections) as info:
            backend.spawn(LIMITS)
    finally:
        backend.close()
    exc = info.value
    assert set(WALLS) <= set(exc.missing)
    assert not exc.retriable and exc.backend == "subprocess"
    assert any("unshare" in reason for reason in exc.reasons), exc.reasons
    assert "SANDFORGE_ALLOW_MISSING_PROTECTIONS=" in str(exc)
    assert exc.verified["seccomp"] and exc.verified["rlimits"]  # what it has is reported, and is not enough


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
def test_the_refusal_reaches_the_caller_as_sandbox_unavailable(monkeypatch: pytest.MonkeyPatch, zygote: bool) -> None:
    monkeypatch.setattr(sandbox_pkg, "make_backend", lambda name, cfg: SubprocessBackend(cfg, runner=NO_NAMESPACES))
    with Sandbox(SandboxConfig(pool_size=0, zygote=zygote)) as sb:
        out = sb.execute(ExecutionRequest(code="return 'ran'"))
    assert out.status == "error" and out.error_type == "sandbox_unavailable" and not out.retriable
    assert out.value is None
    assert set(WALLS) <= set(out.metadata["protections_missing"])
    assert out.protections["seccomp"] and not out.protections["net_namespace"]


def test_running_weaker_is_an_explicit_waiver_shown_in_every_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_pkg, "make_backend", lambda name, cfg: SubprocessBackend(cfg, runner=NO_NAMESPACES))
    with Sandbox(SandboxConfig(pool_size=0, allow_missing=WALLS)) as sb:
        out = sb.execute(ExecutionRequest(code="return 'ran'"))
    assert out.ok and out.value == "ran", out.error_message
    assert set(out.metadata["protections_waived"]) == set(WALLS)
    assert not out.protections["net_namespace"] and out.protections["seccomp"]


def test_a_full_sandbox_has_no_waiver_in_its_metadata() -> None:
    with Sandbox(SandboxConfig(pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return 1"))
    assert out.ok, out.error_message
    assert "protections_waived" not in out.metadata
    assert all(out.protections[p] for p in DEFAULT_REQUIRED), out.protections


def test_the_host_does_not_take_claims_on_trust() -> None:
    """A process with none of the walls, claiming all of them, is verified as having none."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        verified = verify_protections(proc.pid, dict.fromkeys(PROTECTIONS, True))
    finally:
        proc.kill()
        proc.wait()
    assert not any(verified[p] for p in (*WALLS, "seccomp", "no_new_privs", "user_namespace")), verified
    if os.geteuid() == 0:
        assert not verified["unprivileged_user"]


# --- rootless mode --------------------------------------------------------------------------------------------


@needs_rootless
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
def test_rootless_sandbox_has_every_wall_verified_from_outside(zygote: bool) -> None:
    with Sandbox(SandboxConfig(pool_size=0, zygote=zygote)) as sb:
        out = sb.execute(ExecutionRequest(code="context['x'] = 1\nreturn 2"))
    assert out.ok and out.value == 2, out.error_message
    assert all(out.protections[p] for p in DEFAULT_REQUIRED), out.protections
    assert out.protections["user_namespace"]


def _escaped(code: str) -> object:
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)
    try:
        out = backend.spawn(LIMITS).execute(ExecutionRequest(code=code, limits=LIMITS), None)
    finally:
        backend.close()
    assert out.ok, f"{out.error_type}: {out.error_message}\n{out.stderr}"
    return out.value


def test_the_program_runs_unprivileged_undumpable_and_without_capabilities() -> None:
    """Checked by unrestricted code inside the sandbox, in both modes."""
    value = _escaped(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "class H(ctypes.Structure):\n    _fields_ = [('v', ctypes.c_uint32), ('p', ctypes.c_int)]\n"
        "data = (ctypes.c_uint32 * 6)()\n"
        "rc = libc.capget(ctypes.byref(H(0x20080522, 0)), ctypes.byref(data))\n"
        "bounding = [c for c in range(41) if libc.prctl(23, c, 0, 0, 0) == 1]\n"  # PR_CAPBSET_READ
        "import os\nreturn {'uid': os.getuid(), 'gid': os.getgid(), 'caps': list(data) if rc == 0 else rc,\n"
        "        'dumpable': libc.prctl(3, 0, 0, 0, 0), 'bounding': bounding, 'groups': os.getgroups()}"
    )
    assert isinstance(value, dict)
    assert value["uid"] == 65534 and value["gid"] == 65534, value
    assert value["caps"] == [0] * 6, value
    assert value["dumpable"] == 0
    assert value["bounding"] == [], value  # the bounding set is empty too: nothing can come back


@needs_rootless
def test_rootless_program_cannot_regain_privilege_or_leave() -> None:
    value = _escaped(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nresults = {}\n"
        "for name, call in [('setuid0', lambda: os.setuid(0)), ('setgroups', lambda: os.setgroups([0])),\n"
        "                   ('chroot', lambda: os.chroot('/'))]:\n"
        "    try:\n        call()\n        results[name] = 'allowed'\n"
        "    except OSError as e:\n        results[name] = e.errno\n"
        "results['mount'] = libc.mount(b'none', b'/', b'tmpfs', 0, None)\n"
        "results['unshare_user'] = libc.unshare(0x10000000)\n"
        "results['uid_map'] = sorted(os.listdir('/'))\n"
        "return results"
    )
    assert isinstance(value, dict)
    assert value["setuid0"] == 1 and value["setgroups"] == 1 and value["chroot"] == 1, value
    assert value["unshare_user"] == -1 and value["mount"] == -1, value
    # a private root, empty but for the tz database's read-only bind (issue 38) and the file area (inputs/,
    # outputs/: issue 41): no /proc to reach the host's user namespace through
    assert set(value["uid_map"]) <= {"usr", "inputs", "outputs"}, value


def _can_unshare_user() -> bool:
    return subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare_user(), reason="needs `unshare -Ur` (user namespaces) to build the test machine")
def test_a_kernel_that_refuses_user_namespaces_gets_a_refusal_not_a_weaker_sandbox(tmp_path: Path) -> None:
    """The real kernel, not a patched runner: inside a user namespace whose limit of nested user namespaces is
    0 (and where uid 65534 does not exist, so the walls must come from user namespaces), doctor fails and
    names what is missing and why, and exec refuses to run."""
    limit = "echo 0 > /proc/sys/user/max_user_namespaces && "
    cli = f"{sys.executable} -c 'from sandforge.runtime.cli import main; main()'"
    root = Path(__file__).resolve().parents[2]
    doctor = subprocess.run(["unshare", "-Ur", "sh", "-c", f"{limit}{cli} doctor --backend subprocess --json"],
                            capture_output=True, text=True, cwd=root, timeout=120)  # fmt: skip
    assert doctor.returncode == 6, doctor.stdout + doctor.stderr  # 6: the sandbox is unavailable (README, exit codes)
    report = json.loads(doctor.stdout)["backends"][0]
    assert not report["works"] and set(WALLS) <= set(report["missing"]), report
    assert "unshare(user)" in report["error"], report["error"]
    program = tmp_path / "p.py"
    program.write_text("return 42\n")
    exec_run = subprocess.run(["unshare", "-Ur", "sh", "-c", f"{limit}{cli} exec {program}"],
                              capture_output=True, text=True, cwd=root, timeout=120)  # fmt: skip
    assert exec_run.returncode == 6, exec_run.stdout + exec_run.stderr
    assert "required protections missing" in exec_run.stdout + exec_run.stderr
    assert "ok: 42" not in exec_run.stdout
