"""A pinned version the index stops listing between the resolve and the install (a stale page of the index's
CDN, seen right after a release) is installed once more with every page revalidated; a manifest that truly has
no solution still fails, after that one retry. The index is a fake uv here: the real one cannot be made stale."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sandforge.runtime.environments import uvtool
from sandforge.runtime.environments.errors import DependencyResolutionFailed
from sandforge.runtime.environments.policy import SourcePolicy
from sandforge.runtime.environments.target import SandboxTarget

NO_VERSION = (
    "  x No solution found when resolving dependencies:\n"
    "  `-> Because there is no version of pandas==3.1.2 and you require pandas==3.1.2, we can conclude that your "
    "requirements are unsatisfiable.\n"
)


def fake_uv(tmp_path: Path, *, stale_until_refresh: bool) -> tuple[uvtool.Uv, Path]:
    """A uv whose install says the pin does not exist: always, or until it is asked with ``--refresh``."""
    log = tmp_path / "calls"
    passes = 'case " $* " in *" --refresh "*) exit 0 ;; esac\n' if stale_until_refresh else ""
    (tmp_path / "complaint").write_text(NO_VERSION)
    script = tmp_path / "uv"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{passes}cat "{tmp_path / "complaint"}" >&2\nexit 1\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return uvtool.Uv(str(script), tmp_path / "cache"), log


def install(uv: uvtool.Uv, tmp_path: Path, target: SandboxTarget) -> None:
    (tmp_path / "pins.txt").write_text("pandas==3.1.2 --hash=sha256:00\n")
    uv.install(tmp_path / "pins.txt", tmp_path / "site", "python3", target, SourcePolicy())


def test_a_pin_the_index_stopped_listing_is_installed_once_more_revalidated(
    tmp_path: Path, target: SandboxTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvtool, "STALE_INDEX_RETRY_S", 0.0)
    uv, log = fake_uv(tmp_path, stale_until_refresh=True)
    install(uv, tmp_path, target)
    first, second = log.read_text().splitlines()
    assert "--refresh" not in first.split() and "--refresh" in second.split()
    assert first.split() == [w for w in second.split() if w != "--refresh"]  # the same install otherwise


def test_a_pin_that_stays_missing_fails_as_unsatisfiable_after_one_retry(
    tmp_path: Path, target: SandboxTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvtool, "STALE_INDEX_RETRY_S", 0.0)
    uv, log = fake_uv(tmp_path, stale_until_refresh=False)
    with pytest.raises(DependencyResolutionFailed, match=r"no version of pandas==3\.1\.2"):
        install(uv, tmp_path, target)
    assert len(log.read_text().splitlines()) == 2
