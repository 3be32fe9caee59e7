"""The session database on a full or read-only file system: typed errors with exit 7, nothing lost that
was committed (issue 14 item 3)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.errors import FileIOError
from sandforge.runtime.sessions import Message, MessageType, SessionStore, SessionStoreError


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_a_typed_error_and_committed_messages_stay(tiny_tmpfs: Path) -> None:
    kept = 0
    with SessionStore(state=tiny_tmpfs / "state") as store:
        session = store.create_session()
        with pytest.raises(SessionStoreError) as info:
            for _ in range(100):
                store.append([Message(session_id=session.id, type=MessageType.USER, content="x" * 20_000)])
                kept += 1
    assert isinstance(info.value, FileIOError) and info.value.exit_code == 7
    assert "full" in str(info.value) and "\n" not in str(info.value)
    assert 0 < kept < 100
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_tmpfs)], check=True)
    with SessionStore(state=tiny_tmpfs / "state") as store:
        assert len(store.messages(session.id)) == kept


def test_a_read_only_file_system_is_a_typed_error(tiny_tmpfs: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    with pytest.raises(SessionStoreError) as info:
        SessionStore(state=tiny_tmpfs / "state")
    assert isinstance(info.value, FileIOError) and info.value.exit_code == 7
    assert "Read-only file system" in str(info.value)
