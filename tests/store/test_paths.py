"""Safe file names for any role or method string, and where the store lives."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandforge.runtime.store import InvalidNameError, StorePaths, ToolStore, default_state_dir, safe_component
from tests.store.conftest import candidate

NASTY = [
    "",
    ".",
    "..",
    "../../etc/passwd",
    "/abs/path",
    "a/b\\c",
    "nul\x00byte",
    "new\nline",
    "CON",
    "manifest",
    "registry",
    "x" * 5000,
    "📰 news bot",
    "Ünïcödé rôle",
    "Web",
    "web",
    " web",
    ".hidden",
    "~user",
]
SAFE = re.compile(r"^[a-z0-9_]+-[0-9a-f]{16}$")


@pytest.mark.parametrize("name", NASTY)
def test_safe_component_is_safe(name: str) -> None:
    comp = safe_component(name)
    assert SAFE.match(comp), comp
    assert len(comp.encode()) <= 57
    assert not comp.startswith(".") and "/" not in comp and "\\" not in comp and ".." not in comp


def test_names_never_collide_even_ignoring_case() -> None:
    comps = [safe_component(n) for n in NASTY]
    assert len({c.lower() for c in comps}) == len(NASTY)


def test_method_named_manifest_does_not_clash() -> None:
    assert StorePaths.method_file_name("manifest") != "manifest.json"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_stays_inside_the_store(name: str) -> None:
    paths = StorePaths("/state")
    for path in (paths.role_dir(name), paths.method_file(name, name), paths.manifest(name)):
        resolved = Path(os.path.normpath(path))
        assert resolved.is_relative_to(paths.tools) and resolved != paths.tools
        assert len(resolved.name.encode()) < 255


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=50), st.text(min_size=1, max_size=50))
def test_distinct_names_give_distinct_components(a: str, b: str) -> None:
    if a != b:
        assert safe_component(a) != safe_component(b)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        safe_component("bad\udc80")


@pytest.mark.parametrize("role", ["../escape", "a/b", "x" * 3000, "Ελληνικά/..", "Web", "web"])
def test_hostile_names_round_trip_through_the_store(store: ToolStore, role: str) -> None:
    method = role + "::method/../x"
    store.record_regeneration(candidate(role=role, method=method, fingerprint=None))
    assert store.lookup(role, method).artifact is not None
    assert store.get_tool(role) is not None
    # everything is inside tools/, one directory per role
    for p in store.tools_dir.rglob("*"):
        assert p.resolve().is_relative_to(store.tools_dir.resolve())


def test_case_variants_are_separate_tools(store: ToolStore) -> None:
    store.record_regeneration(candidate(role="Web", fingerprint=None, code="return 'upper'"))
    store.record_regeneration(candidate(role="web", fingerprint=None, code="return 'lower'"))
    upper, lower = store.lookup("Web", "fetch_url").artifact, store.lookup("web", "fetch_url").artifact
    assert upper is not None and lower is not None
    assert (upper.code, lower.code) == ("return 'upper'", "return 'lower'")


def test_layout(store: ToolStore) -> None:
    store.record_regeneration(candidate())
    store.record_pattern("assistant", "ask", ["rss_parse"])
    tools = store.tools_dir
    assert tools == store.paths.state_dir / "tools"
    assert (tools / "registry.sqlite").is_file() and not (tools / "registry.json").exists()
    assert (tools / "patterns.json").is_file()
    role_dir = tools / safe_component("web_fetcher")
    assert (role_dir / "manifest.json").is_file()
    assert (role_dir / f"{safe_component('fetch_url')}.json").is_file()


def test_state_dir_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "env-state"))
    assert default_state_dir() == tmp_path / "env-state"
    assert ToolStore().tools_dir == tmp_path / "env-state" / "tools"
    assert ToolStore(tmp_path / "arg").tools_dir == tmp_path / "arg" / "tools"  # argument wins


def test_default_state_dir_is_the_platform_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("SANDFORGE_STATE_DIR", raising=False)
    assert default_state_dir() == platformdirs.user_state_path("sandforge")


def test_reading_creates_nothing(tmp_path: Path) -> None:
    store = ToolStore(tmp_path / "none")
    assert store.list_tools() == []
    assert store.lookup("r", "m").artifact is None
    assert store.patterns.events("r") == []
    assert not (tmp_path / "none").exists()
