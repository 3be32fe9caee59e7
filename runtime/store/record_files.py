"""Reading and writing store files: lock-free reads, atomic writes, quarantine of unusable files.

A reader never takes the lock (writes are atomic renames, so it sees a whole old or a whole new file).
When a file cannot be used, the reader takes the lock and looks again before quarantining it: the file
may have been replaced by a writer in the meantime, and a good file is never moved aside.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, Literal, TypeVar

from filelock import FileLock, Timeout
from pydantic import BaseModel

from sandforge.runtime.errors import FileIOError, InputFileError, InputFileMissing
from sandforge.runtime.files import SymlinkRefused, make_dirs, open_dir_below, read_state_file, write_state_file
from sandforge.runtime.store.errors import StoreIOError, StoreLockTimeout
from sandforge.runtime.store.migrations import CorruptRecord, RecordKind, decode
from sandforge.runtime.store.paths import store_root

#: No store file may be larger (a registry of ~30,000 tools); a bigger one is treated as corrupt.
MAX_STORE_FILE_BYTES = 64 * 1024 * 1024

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

Status = Literal["ok", "missing", "corrupt"]


@dataclass(frozen=True)
class Loaded(Generic[M]):
    value: M | None
    status: Status
    migrated: bool = False
    reason: str = ""
    quarantined_to: Path | None = None


@contextmanager
def locked(lock: FileLock) -> Iterator[None]:
    """Hold ``lock`` (re-entrant within one thread), creating its directory; typed errors on failure."""
    try:
        make_dirs(Path(lock.lock_file).parent)
        lock.acquire()
    except Timeout as exc:
        raise StoreLockTimeout(
            f"could not lock {lock.lock_file} within {lock.timeout:g}s",
            hint="another sandforge process is using this store; retry, or raise the lock timeout",
        ) from exc
    except OSError as exc:
        raise StoreIOError(f"cannot lock {lock.lock_file}: {exc.strerror or exc}") from exc
    try:
        yield
    finally:
        lock.release()


class DecodeCache(Generic[M]):
    """Remembers the last decoded version of one file, keyed by its exact bytes.

    Keyed by content, not by stat: inode numbers are reused and mtimes are coarse, so a stat key could
    hand a writer a stale registry and lose an update. Comparing bytes (a memcmp) is far cheaper than
    parsing them (docs/benchmarks.md, "Numbers behind the code").
    """

    def __init__(self) -> None:
        # one tuple, replaced whole: a thread reading while another puts never pairs new bytes with an old value
        self._entry: tuple[bytes, M, bool] | None = None

    def get(self, raw: bytes) -> tuple[M, bool] | None:
        """The value decoded from exactly ``raw`` and whether it was migrated, or None."""
        entry = self._entry
        return (entry[1], entry[2]) if entry is not None and entry[0] == raw else None

    def put(self, raw: bytes, value: M, migrated: bool) -> None:
        self._entry = (raw, value, migrated)


def _read(
    path: Path,
    kind: RecordKind[M],
    check: Callable[[M], str | None] | None,
    cache: DecodeCache[M] | None = None,
) -> Loaded[M]:
    try:  # O_NOFOLLOW on the way, O_NONBLOCK, regular files only, size-capped: a FIFO, a device or a
        # symlink planted in the store is "corrupt", never read
        raw = read_state_file(store_root(path), path, limit=MAX_STORE_FILE_BYTES, what="store file")
    except InputFileMissing:
        return Loaded(None, "missing")
    except InputFileError as exc:  # a link, a FIFO, a directory where the file should be, too large
        return Loaded(None, "corrupt", reason=exc.message)
    if cache is not None and (hit := cache.get(raw)) is not None:
        return Loaded(hit[0], "ok", migrated=hit[1])
    try:
        value, migrated = decode(kind, raw, path)
    except CorruptRecord as exc:
        return Loaded(None, "corrupt", reason=str(exc))
    if check is not None and (problem := check(value)) is not None:
        return Loaded(None, "corrupt", reason=problem)
    if cache is not None:
        cache.put(raw, value, migrated)
    return Loaded(value, "ok", migrated=migrated)


def unique_name(candidate: Path) -> Path:
    """``candidate``, or ``<candidate>-<n>`` for the first n that names no file yet."""
    found, n = candidate, 1
    while found.exists() or found.is_symlink():
        found = candidate.with_name(f"{candidate.name}-{n}")
        n += 1
    return found


def quarantine_name(path: Path, now: datetime) -> Path:
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    candidate = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    return candidate


def load(
    path: Path,
    kind: RecordKind[M],
    *,
    lock: FileLock,
    now: Callable[[], datetime],
    check: Callable[[M], str | None] | None = None,
    cache: DecodeCache[M] | None = None,
) -> Loaded[M]:
    """Load ``path`` as ``kind``. Corrupt: quarantined (renamed ``<name>.corrupt-<timestamp>``), logged.

    SchemaTooNewError propagates: data from a newer sandforge is refused, not quarantined.
    """
    first = _read(path, kind, check, cache)
    if first.status != "corrupt":
        return first
    with locked(lock):
        again = _read(path, kind, check, cache)
        if again.status != "corrupt":
            return again
        dest = quarantine_name(path, now())
        try:
            _rename_below(path, dest)
        except FileNotFoundError:
            return Loaded(None, "missing")
        except (OSError, SymlinkRefused) as exc:  # a symlinked directory on the way: never rename through it
            log.warning("%s is corrupt (%s) and could not be quarantined: %s", path, again.reason, exc)
            return Loaded(None, "corrupt", reason=again.reason)
    log.warning("quarantined corrupt %s %s -> %s (%s)", kind.name, path, dest.name, again.reason)
    return Loaded(None, "corrupt", reason=again.reason, quarantined_to=dest)


def _rename_below(path: Path, dest: Path) -> None:
    """Rename ``path`` to ``dest`` (same directory) without following a symlinked directory on the way."""
    base = store_root(path)
    dfd = open_dir_below(base, path.relative_to(base).parts[:-1], create=False)
    try:
        os.rename(path.name, dest.name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def write(path: Path, record: M, cache: DecodeCache[M] | None = None) -> None:
    """Atomic private write (0600 file, 0700 directories, no symlink followed below tools/) as indented JSON."""
    data = record.model_dump_json(indent=2).encode("utf-8") + b"\n"
    try:
        write_state_file(store_root(path), path, data)
    except (FileIOError, SymlinkRefused) as exc:
        raise StoreIOError(exc.message, hint=exc.hint) from None
    if cache is not None:
        cache.put(data, record, False)
