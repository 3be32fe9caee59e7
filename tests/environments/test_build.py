"""Building environments from the wheelhouse, offline: real packages, really installed and imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.errors import (
    DependencyInstallFailed,
    DependencyPolicyViolation,
    DependencyResolutionFailed,
    EnvironmentPreparing,
    InvalidDependencyManifest,
)
from sandforge.runtime.environments.identity import EnvironmentSpec, Pin
from sandforge.runtime.environments.manifest import Manifest, normalise
from sandforge.runtime.environments.records import MOUNT_PATH
from sandforge.runtime.environments.target import SandboxTarget
from tests.environments.helpers import calls, make_sdist, make_wheel, offline_policy, uv_wrapper

DATEUTIL_BS4 = normalise(["python-dateutil>=2.8", "beautifulsoup4"])


def _run_in(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in an isolated interpreter whose only third-party path is ``site`` (no bytecode writes)."""
    prelude = f"import sys; sys.path.insert(0, {str(site)!r}); "
    return subprocess.run([sys.executable, "-I", "-S", "-B", "-c", prelude + code], capture_output=True, text=True)


def test_build_offline_installs_importable_packages(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    prepared = store.prepare(DATEUTIL_BS4, offline_policy(house), target)
    assert not prepared.cache_hit
    pins = {pin.name: pin for pin in prepared.record.spec.pins}
    assert set(pins) >= {"python-dateutil", "beautifulsoup4", "soupsieve"}
    assert all(h.startswith("sha256:") for pin in pins.values() for h in pin.hashes)
    done = _run_in(
        prepared.site,
        "from dateutil import parser; import bs4; "
        "print(parser.parse('2024-02-29T10:00').isoformat(), bs4.BeautifulSoup('<b>hi</b>', 'html.parser').b.text)",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2024-02-29T10:00:00", "hi"]
    assert prepared.record.provides["python-dateutil"] == ("dateutil",)
    assert "bs4" in prepared.record.top_level
    fields = prepared.log_fields()
    assert fields["env_id"] == prepared.env_id and fields["environment_cache_hit"] is False
    assert {"env_prepare_ms", "env_resolve_ms", "env_install_ms"} <= set(fields)


def test_bytecode_is_precompiled_naming_the_mount_and_files_are_hard_links(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    site = store.prepare(DATEUTIL_BS4, offline_policy(house), target).site
    parser = site / "dateutil" / "parser" / "_parser.py"
    pyc = site / "dateutil" / "parser" / "__pycache__" / f"_parser.{target.cache_tag}.pyc"
    assert pyc.is_file()
    assert parser.stat().st_nlink >= 2  # shared with the uv cache, not copied
    assert MOUNT_PATH.encode() + b"/dateutil/parser/_parser.py" in pyc.read_bytes()
    # nothing in the environment is writable by anyone but its owner
    for path in [site, *site.rglob("*")]:
        assert not path.lstat().st_mode & 0o022, path
    assert not (store.root / "cache").is_relative_to(site)  # the uv cache is beside, never inside, the mount


def test_a_second_prepare_is_a_cache_hit_that_runs_no_uv(tmp_path: Path, house: Path, target: SandboxTarget) -> None:
    log = tmp_path / "uv.log"
    store = EnvironmentStore(tmp_path / "root", uv=uv_wrapper(tmp_path, log=log))
    first = store.prepare(DATEUTIL_BS4, offline_policy(house), target)
    assert calls(log) == ["compile", "install"]
    again = EnvironmentStore(tmp_path / "root", uv=uv_wrapper(tmp_path, log=log)).prepare(
        normalise(["beautifulsoup4", "python_dateutil>=2.8"]), offline_policy(house), target
    )
    assert again.cache_hit and again.env_id == first.env_id
    assert calls(log) == ["compile", "install"]  # neither resolved nor installed again
    assert again.log_fields() == {"env_id": first.env_id, "environment_cache_hit": True,
                                  "env_prepare_ms": round(again.prepare_ms, 3)}  # fmt: skip


def test_two_source_policies_get_two_environments(store: EnvironmentStore, house: Path, target: SandboxTarget) -> None:
    other = house.parent / "other-house"
    shutil.copytree(house, other)
    one = store.prepare(DATEUTIL_BS4, offline_policy(house), target)
    two = store.prepare(DATEUTIL_BS4, offline_policy(other), target)
    assert one.env_id != two.env_id
    assert one.record.spec.pins == two.record.spec.pins  # same packages, different identity
    assert {r.env_id for r in store.ready()} == {one.env_id, two.env_id}


def test_another_sandbox_interpreter_gets_another_environment(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    older = target.model_copy(update={"version": "3.11.2"})  # the image's interpreter
    one = store.prepare(DATEUTIL_BS4, offline_policy(house), target)
    two = store.prepare(DATEUTIL_BS4, offline_policy(house), older)
    assert one.env_id != two.env_id


def test_a_transitive_dependency_must_be_allowed_too(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    policy = offline_policy(house, allow=("beautifulsoup4", "python-dateutil"))
    with pytest.raises(DependencyPolicyViolation) as caught:
        store.prepare(DATEUTIL_BS4, policy, target)
    assert caught.value.reason == "transitive"
    assert "soupsieve" in caught.value.names and "tzdata" in caught.value.names
    assert "required by the declared dependencies" in str(caught.value)
    assert store.ready() == [] and not (store.root / "envs").exists()  # refused before anything was built


def test_an_http_client_is_never_installed_even_as_a_dependency(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    make_wheel(house, "fetchy", "1.0", requires=("requests>=2",))
    make_wheel(house, "requests", "2.32.0")
    policy = offline_policy(house, allow=("fetchy",))
    with pytest.raises(DependencyPolicyViolation, match="requests: an HTTP client library") as caught:
        store.prepare(normalise(["fetchy"]), policy, target)
    assert caught.value.names == ("requests",)
    with pytest.raises(DependencyPolicyViolation, match="HTTP client"):
        store.prepare(normalise(["requests"]), policy, target)
    assert store.ready() == []


def test_an_sdist_only_package_is_refused_and_never_built(
    tmp_path: Path, store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    ran = tmp_path / "setup-py-ran"
    make_sdist(house, "sdist-only", "1.0", ran_marker=ran)
    policy = offline_policy(house, allow=("sdist-only", "six"))
    with pytest.raises(DependencyPolicyViolation, match="source distribution") as caught:
        store.prepare(normalise(["sdist-only"]), policy, target)
    assert caught.value.reason == "sdist_only" and caught.value.names == ("sdist-only",)
    assert "allowed distributions: sdist-only, six" in str(caught.value)
    assert not ran.exists()
    assert store.ready() == []


def test_unsatisfiable_pins_are_a_resolution_failure(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    for manifest in (normalise(["six>=99"]), normalise(["no-such-distribution"])):
        with pytest.raises(DependencyResolutionFailed) as caught:
            store.prepare(manifest, offline_policy(house, allow=("six", "no-such-distribution")), target)
        assert caught.value.kind == "dependency_resolution_failed"


def test_requires_python_is_checked_against_the_sandbox(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    manifest = Manifest(requirements=normalise(["six"]).requirements, requires_python=">=4")
    with pytest.raises(InvalidDependencyManifest, match="the sandbox runs"):
        store.prepare(manifest, offline_policy(house), target)


def test_a_tampered_wheel_fails_the_install_and_leaves_nothing(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    good = store.prepare(normalise(["six"]), offline_policy(house), target).record.spec
    bad = Pin(name="six", version=good.pins[0].version, hashes=("sha256:" + "0" * 64,))
    forged = good.model_copy(update={"pins": (bad,)})
    with pytest.raises(DependencyInstallFailed) as caught:
        EnvironmentStore(store.root.parent / "fresh").ensure(forged)
    assert caught.value.kind == "dependency_install_failed"
    assert not list((store.root.parent / "fresh" / "envs").iterdir())


def test_an_environment_over_max_env_mb_is_refused(store: EnvironmentStore, house: Path, target: SandboxTarget) -> None:
    with pytest.raises(DependencyPolicyViolation, match="max_env_mb") as caught:
        store.prepare(DATEUTIL_BS4, offline_policy(house, max_env_mb=1), target)
    assert caught.value.reason == "max_env_mb"
    assert store.ready() == [] and store.leftovers() == []


def test_offline_without_a_wheelhouse_is_an_install_failure(store: EnvironmentStore, target: SandboxTarget) -> None:
    policy = offline_policy(Path("/nonexistent")).model_copy(update={"wheelhouse": None})
    with pytest.raises(DependencyInstallFailed, match="no wheelhouse"):
        store.prepare(normalise(["six"]), policy, target)


def test_an_empty_manifest_needs_no_environment(store: EnvironmentStore, house: Path, target: SandboxTarget) -> None:
    with pytest.raises(InvalidDependencyManifest, match="no dependency"):
        store.prepare(Manifest(), offline_policy(house), target)


def test_a_busy_build_lock_past_the_wait_is_environment_preparing(
    tmp_path: Path, house: Path, target: SandboxTarget
) -> None:
    store = EnvironmentStore(tmp_path / "root", wait_s=0.2)
    spec = _spec_of(store, house, target)
    store.locks.mkdir(parents=True, exist_ok=True)
    # another builder holds the lock
    with FileLock(store.locks / f"{spec.env_id}.lock"), pytest.raises(EnvironmentPreparing) as caught:
        store.ensure(spec)
    assert caught.value.kind == "environment_preparing"
    assert store.ensure(spec).env_id == spec.env_id  # once released, it builds


def test_a_stored_spec_rebuilds_the_same_environment_in_a_fresh_state_dir(
    tmp_path: Path, store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    first = store.prepare(DATEUTIL_BS4, offline_policy(house), target)
    stored = json.loads(first.record.spec.model_dump_json())  # what a persisted artifact keeps
    fresh = EnvironmentStore(tmp_path / "new-machine" / "environments")
    rebuilt = fresh.ensure(EnvironmentSpec.model_validate(stored))
    assert rebuilt.env_id == first.env_id and not rebuilt.cache_hit
    assert _run_in(rebuilt.site, "import dateutil.tz, bs4").returncode == 0


def test_a_damaged_environment_is_not_ready_and_is_rebuilt(
    store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    first = store.prepare(normalise(["six"]), offline_policy(house), target)
    record = store.envs / first.env_id / "environment.json"
    record.write_text("{ not json")
    assert store.record(first.env_id) is None and store.ready() == []
    again = store.prepare(normalise(["six"]), offline_policy(house), target)
    assert not again.cache_hit and store.record(first.env_id) is not None


def _spec_of(store: EnvironmentStore, house: Path, target: SandboxTarget) -> EnvironmentSpec:
    scratch = EnvironmentStore(store.root.parent / f"scratch-{os.getpid()}")
    return scratch.prepare(normalise(["six"]), offline_policy(house), target).record.spec


def test_a_wheel_cannot_write_outside_its_environment(
    tmp_path: Path, store: EnvironmentStore, house: Path, target: SandboxTarget
) -> None:
    escape = {"../escaped.py": b"X = 1\n", "../../../escaped_far.py": b"X = 2\n"}
    make_wheel(house, "sneaky", "1.0", extra=escape)
    prepared = store.prepare(normalise(["sneaky"]), offline_policy(house, allow=("sneaky",)), target)
    assert sorted(p.name for p in prepared.site.iterdir()) == ["__pycache__", "sneaky-1.0.dist-info", "sneaky.py"]
    assert not list(tmp_path.rglob("escaped*.py"))
    assert prepared.record.provides == {"sneaky": ("sneaky",)}
