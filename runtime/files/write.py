"""Crash-safe, private writes: a reader sees the old file or the new one, never half of either.

Every write goes to a temp file in the target's directory (created 0600, ``O_EXCL|O_NOFOLLOW``), is
fsynced, renamed over the target, and the directory is fsynced. Any ``OSError`` (ENOSPC, EROFS, EACCES,
EDQUOT, ...) removes the temp file, leaves the original untouched and becomes one :class:`FileIOError`
line (exit 7).

- *user files* (``write_user_file``: a committed ``--context``): a symlink is written **through** to its
  target (resolved once; the link stays a link), and an existing target keeps its mode and owner. New
  files are 0600, new directories 0700 (contexts hold secrets).
- *state files* (``write_state_file``: the ToolStore): below a trusted base, no symlink is followed on the
  way (see ``read.open_dir_below``); the file is always 0600 and directories 0700, whatever was there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from sandforge.runtime.errors import FileIOError
from sandforge.runtime.files.dirs import make_dirs, open_dir_below, split_below

_HINTS = {
    errno.ENOSPC: "the file system is full; free some space and retry",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "check the permissions of the file and its directory",
    errno.EPERM: "check the permissions of the file and its directory",
}


def io_error(action: str, path: Path | str, exc: OSError) -> FileIOError:
    """One typed line for an OSError: what failed, where, why (errno name), and a hint when there is one."""
    name = errno.errorcode.get(exc.errno or 0, "")
    why = exc.strerror or str(exc)
    return FileIOError(f"cannot {action} {path}: {why}{f' ({name})' if name else ''}", hint=_HINTS.get(exc.errno or 0))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace_in(dfd: int, name: str, data: bytes, *, like: os.stat_result | None) -> None:
    """Temp file + fsync + rename inside the directory open on ``dfd``; mode/owner copied from ``like``."""
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            if like is not None:
                mine = os.fstat(fd)
                if (mine.st_uid, mine.st_gid) != (like.st_uid, like.st_gid):
                    try:  # before the mode: chown may clear set-id bits
                        os.fchown(fd, like.st_uid, like.st_gid)
                    except PermissionError:  # refused, not weakened: a new group could read the secret
                        raise FileIOError(
                            f"cannot write {name}: its owner {like.st_uid}:{like.st_gid} cannot be kept by this "
                            "user (EPERM); nothing was written",
                            hint="run as the file's owner, or chgrp the file to one of your groups",
                        ) from None
                os.fchmod(fd, stat.S_IMODE(like.st_mode))
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    os.fsync(dfd)


def write_user_file(path: Path, data: bytes) -> Path:
    """Atomically replace the file the user named (through a symlink), keeping its mode and owner.

    Returns the path really written (the symlink's target). FileIOError on any OSError.
    """
    target = Path(os.path.realpath(path))
    try:
        try:
            like: os.stat_result | None = target.stat()
        except FileNotFoundError:
            like = None
        if like is not None and not stat.S_ISREG(like.st_mode):
            raise FileIOError(f"cannot write {path}: it is not a regular file")
        make_dirs(target.parent)
        dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _replace_in(dfd, target.name, data, like=like)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise io_error("write", path, exc) from None
    return target


def write_state_file(base: Path, path: Path, data: bytes) -> None:
    """Atomically write ``path`` below ``base``: 0600, directories 0700, no symlink followed below ``base``.

    FileIOError on any OSError; SymlinkRefused (an InputFileError) when a link is in the way.
    """
    parts = split_below(base, path)
    try:
        dfd = open_dir_below(base, parts[:-1], create=True)
        try:
            _replace_in(dfd, parts[-1], data, like=None)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise io_error("write", path, exc) from None


def make_private_dir(path: Path) -> None:
    """``mkdir -p`` with 0700 for every directory it creates; FileIOError on failure."""
    try:
        make_dirs(path)
    except OSError as exc:
        raise io_error("create directory", path, exc) from None


def append_line(path: Path, line: bytes) -> None:
    """Append one line to a private JSON-lines file in a single ``O_APPEND`` write (concurrent writers' lines
    stay whole; a reader never sees half of one): a new file is 0600 and its new directories 0700, only a
    regular file is appended to (``O_NONBLOCK``: a FIFO in its place fails instead of hanging), and no symlink
    is followed at the last step. FileIOError on any OSError."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    data = line if line.endswith(b"\n") else line + b"\n"
    try:
        make_dirs(path.parent)
        fd = os.open(path, flags, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)
    except OSError as exc:
        raise io_error("append to", path, exc) from None
