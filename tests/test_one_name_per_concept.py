"""The shared helpers that replaced several copies (issue 17 item 4): each used by every former owner."""

from __future__ import annotations

import gc
from pathlib import Path

import platformdirs
import pytest

from sandforge.runtime.agent.calllog import default_log_path
from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.sessions import default_db_path
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store import StorePaths, default_state_dir


def test_gc_paused_restores_an_enabled_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner one must not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gc_paused_restores_on_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_one_state_dir_for_store_sessions_and_call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORGE_CALL_LOG", raising=False)
    monkeypatch.setenv("SANDFORGE_STATE_DIR", f"  {tmp_path}  ")
    assert resolve_state_dir() == tmp_path
    assert default_state_dir() == tmp_path
    assert StorePaths().state_dir == tmp_path
    assert default_db_path() == tmp_path / "sessions.db"
    assert default_log_path() == tmp_path / "logs" / "calls.jsonl"


def test_state_dir_override_and_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", " ")
    assert resolve_state_dir() == platformdirs.user_state_path("sandforge")
    assert resolve_state_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_state_dir("~/state") == tmp_path / "state"
