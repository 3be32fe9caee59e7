"""The sandbox target: probing an interpreter, remembering it, refusing what environments cannot target;
and the manifest's normal form as a property."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandforge.runtime.environments.errors import DependencyInstallFailed, InvalidDependencyManifest
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.target import SandboxTarget, TargetCache, interpreter_key, parse_probe, probe


def test_probe_describes_this_interpreter() -> None:
    target = probe()
    assert target.version == ".".join(map(str, sys.version_info[:3]))
    assert target.cache_tag == sys.implementation.cache_tag
    assert target.abi == f"cp3{sys.version_info[1]}"
    assert target.uv_args()[:2] == ["--python-version", target.version]
    assert target.uv_platform.startswith(f"{target.machine}-manylinux_")


@pytest.mark.parametrize(
    "output",
    [
        b"not json",
        b'{"implementation": "pypy"}',
        b'{"implementation": "cpython", "version": "3.11.2", "cache_tag": "cpython-311", "platform": "linux-x86_64",'
        b' "machine": "x86_64", "libc": "", "libc_version": ""}',  # musl: no glibc version
    ],
)
def test_an_interpreter_environments_cannot_target_is_refused(output: bytes) -> None:
    with pytest.raises(DependencyInstallFailed, match="not one environments can target"):
        parse_probe(output)


def test_a_missing_interpreter_is_an_install_failure(tmp_path: Path) -> None:
    with pytest.raises(DependencyInstallFailed, match="cannot run"):
        probe(str(tmp_path / "no-python"))


def test_the_target_cache_runs_the_probe_once_per_key(tmp_path: Path) -> None:
    cache = TargetCache(tmp_path / "targets")
    seen: list[str] = []

    def describe() -> SandboxTarget:
        seen.append("probe")
        return probe()

    key = interpreter_key()
    first = cache.get(key, describe)
    assert TargetCache(tmp_path / "targets").get(key, describe) == first
    assert seen == ["probe"]
    cache.get(key + "-other", describe)
    assert seen == ["probe", "probe"]


_names = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,5}([-_.][A-Za-z0-9]{1,4})?", fullmatch=True)
_versions = st.lists(st.integers(0, 30), min_size=1, max_size=3).map(lambda parts: ".".join(map(str, parts)))
_specs = st.one_of(st.just(""), st.tuples(st.sampled_from([">=", "<", "!=", "~=", "=="]), _versions).map("".join))
_requirements = st.lists(st.tuples(_names, _specs).map("".join), max_size=8)


@given(_requirements)
def test_normal_form_is_a_fixed_point(requirements: list[str]) -> None:
    try:
        manifest = normalise(requirements)
    except InvalidDependencyManifest:  # conflicting duplicates, `~=` with one part: refused, typed
        return
    assert normalise(manifest.lines()) == manifest
    assert normalise(reversed(manifest.lines())) == manifest
    assert list(manifest.names) == sorted(set(manifest.names))
