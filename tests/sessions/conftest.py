from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.sessions import SessionStore


@pytest.fixture
def session_store(tmp_path: Path) -> Iterator[SessionStore]:
    store = SessionStore(state=tmp_path / "state")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the real user state directory."""
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "env-state"))
