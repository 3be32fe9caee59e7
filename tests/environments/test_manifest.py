"""The manifest rules: PEP 723 blocks, PEP 503 names, PEP 440 specifiers, duplicates merged or refused."""

from __future__ import annotations

import pytest

from sandforge.runtime.environments.errors import InvalidDependencyManifest
from sandforge.runtime.environments.manifest import MAX_REQUIREMENTS, manifest_of, normalise, script_metadata

BLOCK = """# /// script
# requires-python = ">=3.11"
# dependencies = [
#   "Python_Dateutil>=2.8",
#   "beautifulsoup4",
# ]
# ///
from dateutil import parser
return parser.parse(args[0]).year
"""


def test_a_pep_723_block_is_read_and_normalised() -> None:
    manifest = manifest_of(BLOCK)
    assert manifest.lines() == ["beautifulsoup4", "python-dateutil>=2.8"]
    assert manifest.requires_python == ">=3.11"
    assert manifest.names == ("beautifulsoup4", "python-dateutil")


def test_a_program_without_a_block_has_an_empty_manifest() -> None:
    assert not manifest_of("return 1\n")
    assert script_metadata("# /// other\n# x = 1\n# ///\nreturn 1\n") is None


def test_the_structured_field_and_the_block_end_in_one_manifest() -> None:
    both = manifest_of(BLOCK, ["SOUPSIEVE>=2", "python-dateutil<5"])
    assert both.lines() == ["beautifulsoup4", "python-dateutil<5,>=2.8", "soupsieve>=2"]
    assert manifest_of("return 1\n", ["beautifulsoup4", "python_dateutil>=2.8"]).lines() == manifest_of(BLOCK).lines()


def test_normal_form_is_independent_of_order_spelling_and_duplicates() -> None:
    one = normalise(["B>=1", "a.b_c[Y,x]", "b>=1"])
    two = normalise(["A-B-C[x,y]", "b >= 1"])
    assert one == two
    assert one.lines() == ["a-b-c[x,y]", "b>=1"]


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        (["six==1.16", "six==1.17"], "conflicting"),
        (["six>=2", "six<2"], "conflicting"),
        (["six>=1.17,<1.17"], None),  # one requirement: the resolver judges it, not the normaliser
        (["six @ https://example.org/six.whl"], "URL"),
        (["six ; python_version < '3.12'"], "marker"),
        (["six>>1"], "not a valid requirement"),
        (["not a name!"], "not a valid requirement"),
        ([""], "empty"),
        (["x" * 300], "longer"),
    ],
)
def test_bad_requirements_are_invalid_manifests(declared: list[str], words: str | None) -> None:
    if words is None:
        assert normalise(declared).lines() == ["six<1.17,>=1.17"]
        return
    with pytest.raises(InvalidDependencyManifest, match=words):
        normalise(declared)


def test_compatible_duplicates_merge_and_extras_join() -> None:
    merged = normalise(["bs4-x[a]>=1", "bs4_x[b]<3", "BS4.X"])
    assert merged.lines() == ["bs4-x[a,b]<3,>=1"]


def test_too_many_requirements_are_refused() -> None:
    with pytest.raises(InvalidDependencyManifest, match="more than"):
        normalise([f"pkg{i}" for i in range(MAX_REQUIREMENTS + 1)])


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("# /// script\n# dependencies = ['six']\nreturn 1\n", "not closed"),
        ("# /// script\n# dependencies = ['six'\n# ///\n", "not valid TOML"),
        ("# /// script\n# dependencies = 'six'\n# ///\n", "list of strings"),
        ("# /// script\n# dependencies = [1]\n# ///\n", "list of strings"),
        ("# /// script\n# packages = ['six']\n# ///\n", "unknown key"),
        ("# /// script\n# requires-python = 3\n# ///\n", "requires-python"),
        ("# /// script\n# requires-python = 'three'\n# ///\n", "requires-python"),
        ("# /// script\n# dependencies = []\n# ///\nx = 1\n" * 2, "more than one"),
    ],
)
def test_malformed_blocks_are_invalid_manifests(source: str, words: str) -> None:
    with pytest.raises(InvalidDependencyManifest, match=words):
        manifest_of(source)


def test_the_manifest_error_is_the_recoverable_kind() -> None:
    with pytest.raises(InvalidDependencyManifest) as caught:
        normalise(["six==1", "six==2"])
    assert caught.value.kind == "invalid_dependency_manifest"
    assert "\n" not in str(caught.value)
