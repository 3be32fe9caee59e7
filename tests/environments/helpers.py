"""Helpers for the environment tests: tiny distributions made on the spot, uv wrappers that count or stall."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.environments.uvtool import uv_binary

WHEELHOUSE_ALLOW = ("python-dateutil", "beautifulsoup4", "soupsieve", "six", "tzdata", "typing-extensions")
REPO = Path(__file__).resolve().parents[2]
#: CI: a missing wheelhouse (or an unreachable index, tests/environments/test_index.py) fails instead of skipping.
REQUIRE = os.environ.get("SANDFORGE_REQUIRE_WHEELHOUSE") == "1"
#: What a usable wheelhouse holds (``.ci/wheelhouse`` downloads them).
NEEDED = ("python_dateutil-", "beautifulsoup4-", "soupsieve-", "six-")


def find_wheelhouse() -> Path | None:
    """``SANDFORGE_TEST_WHEELHOUSE`` (or the repository's ``.wheelhouse/``) when it has every `NEEDED` wheel."""
    configured = os.environ.get("SANDFORGE_TEST_WHEELHOUSE", "").strip()
    path = Path(configured) if configured else REPO / ".wheelhouse"
    if not path.is_dir():
        return None
    names = [p.name for p in path.glob("*.whl")]
    return path if all(any(n.startswith(prefix) for n in names) for prefix in NEEDED) else None


def require_wheelhouse() -> Path:
    """The wheelhouse; the test skips without one, or fails under SANDFORGE_REQUIRE_WHEELHOUSE=1 (as in CI)."""
    found = find_wheelhouse()
    if found is None:
        message = "no wheelhouse: run .ci/wheelhouse (or set SANDFORGE_TEST_WHEELHOUSE)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    return found


def require_index() -> None:
    """The package index (pypi.org) is reachable, or the test skips (fails under SANDFORGE_REQUIRE_WHEELHOUSE=1)."""
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        if REQUIRE:
            pytest.fail("the package index is unreachable")
        pytest.skip("the package index is unreachable")


def offline_policy(house: Path, *, allow: tuple[str, ...] = WHEELHOUSE_ALLOW, **more: object) -> DependencyPolicy:
    return DependencyPolicy.model_validate({"allow": allow, "source": "offline", "wheelhouse": str(house), **more})


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    module: str = "",
    extra: dict[str, bytes] | None = None,
) -> Path:
    """A minimal, valid pure-Python wheel: one module that records its own name (plus ``extra`` files,
    listed in its RECORD, whatever their paths)."""
    module = module or name.replace("-", "_")
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{module}.py": f"NAME = {name!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **(extra or {}),
    }
    record = "".join(_record_line(k, v) + "\n" for k, v in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in files.items():
            archive.writestr(key, value)
        archive.writestr(f"{dist}.dist-info/RECORD", record)
    return path


def make_sdist(directory: Path, name: str, version: str, *, ran_marker: Path) -> Path:
    """A source distribution whose setup.py, if anyone ever ran it, would create ``ran_marker``."""
    base = f"{name}-{version}"
    members = {
        f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{base}/setup.py": (
            f"import pathlib\npathlib.Path({str(ran_marker)!r}).write_text('ran')\n"
            f"from setuptools import setup\nsetup(name={name!r}, version={version!r})\n"
        ).encode(),
    }
    path = directory / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for key, value in members.items():
            info = tarfile.TarInfo(key)
            info.size = len(value)
            archive.addfile(info, io.BytesIO(value))
    return path


def uv_wrapper(directory: Path, *, log: Path, stall_after_install: Path | None = None) -> str:
    """A uv that logs each subcommand to ``log``; with ``stall_after_install`` it creates that file after a
    real install and then sleeps (so a test can kill the build halfway)."""
    stall = ""
    if stall_after_install is not None:
        stall = f'if [ "$2" = install ]; then "{uv_binary()}" "$@"; touch "{stall_after_install}"; exec sleep 120; fi\n'
    script = directory / "uv-wrapper"
    script.write_text(f'#!/bin/sh\necho "$2" >> "{log}"\n{stall}exec "{uv_binary()}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []
