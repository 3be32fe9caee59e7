"""The ToolStore reads only what it wrote (issue 13 item 10): a FIFO, a device or a symlink planted in the
store is treated as corrupt and never read or followed; a symlinked role directory never makes the store
write outside its tree; store files are 0600 and directories 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandforge.runtime.store import LookupStatus, StoreIOError, ToolStore
from sandforge.runtime.store import record_files as store_files
from tests.store.conftest import WEB_FETCHER, candidate


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def filled(store: ToolStore) -> ToolStore:
    store.register_tool(WEB_FETCHER)
    store.record_regeneration(candidate())
    store.record_pattern("assistant", "ask", ["rss_parse"])
    return store


def test_store_files_are_private(filled: ToolStore) -> None:
    tools = filled.tools_dir
    files = [p for p in tools.rglob("*") if p.is_file()]
    dirs = [tools, *(p for p in tools.rglob("*") if p.is_dir())]
    assert {p.name for p in files} >= {"registry.sqlite", "patterns.json", "manifest.json", ".store.lock"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert {str(d): _mode(d) for d in dirs} == {str(d): 0o700 for d in dirs}


def test_a_rewrite_makes_an_old_world_readable_file_private(filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    path.chmod(0o644)
    filled.record_success("web_fetcher", "fetch_url")
    assert _mode(path) == 0o600


def test_a_fifo_in_place_of_the_registry_does_not_hang(filled: ToolStore) -> None:
    registry = filled.paths.registry
    registry.unlink()
    os.mkfifo(registry)
    fresh = ToolStore(filled.paths.state_dir)
    entry = fresh.get_tool("web_fetcher")  # rebuilt from the role directories, the FIFO moved aside
    assert entry is not None and entry.role == "web_fetcher"
    assert not stat.S_ISFIFO(registry.lstat().st_mode)
    assert [p for p in registry.parent.iterdir() if p.name.startswith("registry.sqlite.corrupt-")]


def test_a_symlink_to_dev_zero_is_refused_not_read(filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    path.unlink()
    path.symlink_to("/dev/zero")
    lookup = ToolStore(filled.paths.state_dir).lookup("web_fetcher", "fetch_url")
    assert lookup.status is not LookupStatus.FOUND
    assert "symlink" in (lookup.reason or "")


def test_an_oversized_store_file_is_corrupt_not_loaded(filled: ToolStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_files, "MAX_STORE_FILE_BYTES", 100)
    lookup = ToolStore(filled.paths.state_dir).lookup("web_fetcher", "fetch_url")
    assert lookup.status is not LookupStatus.FOUND and "over the limit" in (lookup.reason or "")


def test_a_symlinked_role_directory_never_makes_the_store_write_outside(filled: ToolStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    role_dir = filled.paths.role_dir("web_fetcher")
    for child in role_dir.iterdir():
        child.rename(outside / child.name)
    role_dir.rmdir()
    role_dir.symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}

    fresh = ToolStore(filled.paths.state_dir)
    assert fresh.lookup("web_fetcher", "fetch_url").status is not LookupStatus.FOUND  # not read through it
    with pytest.raises(StoreIOError, match="symlink"):
        fresh.record_regeneration(candidate())
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before  # nothing written, renamed or added


def test_the_store_base_itself_may_be_a_symlink(tmp_path: Path) -> None:
    """The user may keep the state directory anywhere (a link to it is theirs to set up)."""
    real = tmp_path / "real-state"
    real.mkdir()
    link = tmp_path / "state-link"
    link.symlink_to(real, target_is_directory=True)
    store = ToolStore(link)
    store.record_regeneration(candidate())
    assert (real / "tools" / "registry.sqlite").is_file()
    assert ToolStore(link).lookup("web_fetcher", "fetch_url").status is LookupStatus.FOUND
