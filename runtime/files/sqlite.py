"""SQLite files sandforge keeps (the session database, a tenant's state database): created private, WAL.

Shared by ``runtime.sessions.db`` and ``runtime.agent.statedb`` so both open their files the same way: a
regular file only (a FIFO would hang every open), 0600 with its ``-wal``/``-shm`` beside it, switched to WAL
with the busy race of two first openers retried."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sandforge.runtime.files.dirs import make_dirs
from sandforge.runtime.files.read import file_kind


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether another connection holds the lock this statement needed."""
    text = str(exc)
    return "locked" in text or "busy" in text


def private_db_file(path: Path, refuse: Callable[[str], Exception]) -> None:
    """Create the database file 0600 (its directory 0700) before SQLite does (SQLite gives its -wal and
    -shm files the database file's mode); refuse anything but a regular file (``refuse(kind)`` is raised);
    make an existing file of ours that others could read private, with its -wal and -shm. OSError as is.

    A file that exists is never opened here, only looked at: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's included, so another connection of this process would lose
    its lock and a process closing its own last connection could then checkpoint and delete the WAL under it
    (commits lost). ``stat`` opens nothing, so a FIFO in the file's place cannot hang it either."""
    make_dirs(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise refuse(file_kind(st.st_mode)) from None
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            path.chmod(stat.S_IMODE(st.st_mode) & ~0o077)
    else:
        os.close(fd)  # a new file: no connection of this process has it open yet
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            st = side.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                side.chmod(stat.S_IMODE(st.st_mode) & ~0o077)


def enable_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> str:
    """Switch the file to WAL and return the journal mode it ends in.

    Two connections opening a new file together can both need its exclusive lock for the switch; SQLite
    then answers SQLITE_BUSY at once instead of waiting (waiting could deadlock), so retry until the
    busy timeout has passed."""
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.005
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return str(row[0]).lower() if row else ""
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextmanager
def immediate(
    conn: sqlite3.Connection, lock: threading.RLock, typed: Callable[[sqlite3.Error], Exception]
) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken with the write lock up front (no deadlock-prone lock upgrades). A failed
    statement rolls it back and raises ``typed(exc)`` (one line); any other exception rolls it back as is."""
    with lock:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise typed(exc) from exc
        try:
            yield conn
        except sqlite3.Error as exc:  # a statement failed (disk full, read-only): typed, one line
            rollback(conn)
            raise typed(exc) from exc
        except BaseException:
            rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            rollback(conn)
            raise typed(exc) from exc


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is still open: on SQLITE_FULL and some I/O errors SQLite has already rolled the
    transaction back itself, and a second ROLLBACK would raise over the real error."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
