"""Bounded reads: every input is a regular file read with a size bound known before the read starts.

Opening with ``O_NONBLOCK`` means a FIFO never blocks the open; the ``fstat`` type check then refuses it,
and every device (``/dev/zero``, ``/dev/urandom``, a terminal) the same way, before a byte is read.

Two kinds of file:

- *user files* (a ``--context`` file, a program, a chat script): the user named them, so a symlink is
  followed to its target (the commit writes through it to the same target, see ``write.py``);
- *state files* (the ToolStore's records): inside sandforge's own tree below a trusted base directory.
  No component below the base may be a symlink (each directory is opened with ``O_NOFOLLOW``), so a
  planted link can neither make sandforge read outside its tree nor write there.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from sandforge.runtime.errors import InputFileError, InputFileMissing
from sandforge.runtime.files.dirs import SymlinkRefused, open_dir_below, split_below

_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_fd(fd: int, *, limit: int, what: str) -> bytes:
    """Every byte of the regular file open on ``fd``, at most ``limit`` of them, else InputFileError."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} is {file_kind(st.st_mode)}, not a regular file; refused")
    if st.st_size > limit:
        raise InputFileError(f"{what} is {st.st_size} bytes, over the limit of {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    while True:  # the file may grow while it is read: stop one byte past the limit
        chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise InputFileError(f"{what} grew past the limit of {limit} bytes while it was read")


def read_stream(stream: BinaryIO, *, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of a stream (stdin), else InputFileError; never reads more than limit + 1."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{what} is over the limit of {limit} bytes")
    return data


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


def read_user_file(path: Path, *, limit: int, what: str = "input file") -> bytes:
    """A file the user named (symlinks followed): regular, at most ``limit`` bytes.

    InputFileMissing when it does not exist, InputFileError (exit 2) for everything else that is wrong.
    """
    label = f"{what} {path}"
    try:
        fd = os.open(path, _FILE_FLAGS)
    except FileNotFoundError:
        raise InputFileMissing(f"cannot read {label}: it does not exist") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {label}: {_strerror(exc)}") from None
    return _read_and_close(fd, limit, label)


def _read_and_close(fd: int, limit: int, label: str) -> bytes:
    """``read_fd`` on an opened descriptor, which is closed whatever happens; OSError is InputFileError."""
    try:
        return read_fd(fd, limit=limit, what=label)
    except OSError as exc:
        raise InputFileError(f"cannot read {label}: {_strerror(exc)}") from None
    finally:
        os.close(fd)


def read_arg_file(name: str, *, limit: int, what: str = "input file") -> bytes:
    """``read_user_file``, or stdin when ``name`` is ``-``."""
    if name == "-":
        return read_stream(sys.stdin.buffer, limit=limit, what=f"{what} <stdin>")
    return read_user_file(Path(name), limit=limit, what=what)


def read_state_file(base: Path, path: Path, *, limit: int, what: str = "state file") -> bytes:
    """A file below ``base`` with no symlink on the way (nor the file itself): regular, at most ``limit``."""
    parts = split_below(base, path)
    label = f"{what} {path}"
    try:
        dfd = open_dir_below(base, parts[:-1], create=False)
    except FileNotFoundError:
        raise InputFileMissing(f"cannot read {label}: it does not exist") from None
    except OSError as exc:
        raise InputFileError(f"cannot read {label}: {_strerror(exc)}") from None
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
        except FileNotFoundError:
            raise InputFileMissing(f"cannot read {label}: it does not exist") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SymlinkRefused(f"{label} is a symlink; refused") from None
            raise InputFileError(f"cannot read {label}: {_strerror(exc)}") from None
        return _read_and_close(fd, limit, label)
    finally:
        os.close(dfd)
