"""Issue 36 item 6: the inner wall runs a RestrictedPython without published escapes. The subprocess backend
uses the installed copy and the image is built from it, so the requirement is checked in one place
(``image.restrictedpython_advisory``): the package's dependency, the image build and ``doctor`` all follow it.
Both advisories are attacked as programs in ``test_generated_code.py``."""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from RestrictedPython import compile_restricted
from RestrictedPython.Guards import safer_getattr

from sandforge.sandbox import image

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["8.0", "8.2", "8.3", "8.4", "8.5", "9.0a1", "not-a-version"])
def test_releases_with_published_escapes_are_refused(version: str) -> None:
    advisory = image.restrictedpython_advisory(version)
    assert advisory is not None and f">={image.RESTRICTEDPYTHON_MINIMUM}" in advisory


@pytest.mark.parametrize("version", ["9.0", "9.1.2", "10.0"])
def test_current_releases_are_accepted(version: str) -> None:
    assert image.restrictedpython_advisory(version) is None


def test_the_installed_release_has_no_published_escape() -> None:
    assert image.restrictedpython_advisory() is None, image.restrictedpython_version()


def test_the_dependency_requires_the_same_minimum() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [spec] = [Requirement(d) for d in project["dependencies"] if re.match(r"RestrictedPython\b", d)]
    assert str(spec.specifier) == f">={image.RESTRICTEDPYTHON_MINIMUM}"


def test_the_image_is_not_built_from_a_release_with_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build context carries the installed copy: it is refused (the tag names the version, so an image
    of an older copy is never the expected one)."""
    monkeypatch.setattr(image, "restrictedpython_version", lambda: "8.2")
    with pytest.raises(image.ImageBuildError, match=r"RestrictedPython 8\.2 has published sandbox escapes"):
        image.build_context(image.inside_files())


@pytest.mark.parametrize("parameters", ["_getattr_, /", "a, _write_, /", "_print_=None, /"])
def test_the_installed_copy_refuses_positional_only_guard_names(parameters: str) -> None:
    """8.3's fix, on the copy the sandbox runs (and the image carries)."""
    with pytest.raises(SyntaxError, match="starts with"):
        compile_restricted(f"def f({parameters}):\n    return 1\n", "<t>", "exec")


@pytest.mark.parametrize("name", ["get_field", "get_value", "vformat", "format"])
def test_the_installed_copy_refuses_formatter_traversal(name: str) -> None:
    """8.4's fix (CVE-2026-76825), on the same copy."""
    with pytest.raises(NotImplementedError):
        safer_getattr(string.Formatter(), name)
