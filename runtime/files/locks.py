"""Per-file exclusive locks: read-modify-write of one file by many processes loses no update.

The lock is a sibling file ``.<name>.lock`` (0600) of the *resolved* target, so two symlinks to one file
share it. It is held from before the file is read until after the rename of the new version; a second
process waits (``SANDFORGE_LOCK_TIMEOUT`` seconds, default 300) and then reads what the first committed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from sandforge.runtime.errors import FileIOError, UsageError
from sandforge.runtime.files.dirs import make_dirs
from sandforge.runtime.files.write import io_error

LOCK_TIMEOUT_ENV = "SANDFORGE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 300.0


def lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not 0 <= value <= 86400:
        raise UsageError(f"{LOCK_TIMEOUT_ENV} must be between 0 and 86400 seconds")
    return value


def lock_path_for(path: Path) -> Path:
    target = Path(os.path.realpath(path))
    return target.with_name(f".{target.name}.lock")


@contextmanager
def exclusive(path: Path, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` (a file that may not exist yet). FileIOError on timeout or I/O."""
    wait = lock_timeout() if timeout is None else timeout
    lock_path = lock_path_for(path)
    lock = FileLock(lock_path, timeout=wait, mode=0o600)
    try:
        make_dirs(lock_path.parent)  # before filelock makes them with the default mode
        lock.acquire()
    except Timeout:
        raise FileIOError(
            f"{path} is locked by another sandforge process (waited {wait:g}s)",
            hint=f"retry later, or raise {LOCK_TIMEOUT_ENV}",
        ) from None
    except OSError as exc:
        raise io_error("lock", path, exc) from None
    try:
        yield
    finally:
        lock.release()
