"""Files on the host (issue 41). An input file named by path: read once, when the request is built, with the
rules every input follows (docs/files.md): a regular file (a FIFO never blocks the open, a device is refused
before a byte is read), not a symlink (a link could pull in a file the caller did not look at), at most
``limit`` bytes even if it grows while it is read. And an output file whose descriptor the runner passed
(``read_passed_output``): checked, then read once."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


class InputRefused(ValueError):
    """An input file that cannot go into a sandbox: what is wrong, in one line."""


def read_input(path: str | os.PathLike[str], limit: int) -> bytes:
    """``path``'s bytes, or InputRefused saying why not."""
    label = f"input file {Path(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputRefused(f"{label} is a symlink; refused (name its target)") from None
        raise InputRefused(f"cannot read {label}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise InputRefused(f"{label} is {kind}, not a regular file; refused")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputRefused(f"{label} is over the limit of {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise InputRefused(f"cannot read {label}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class PassedOutputRefused(ValueError):
    """A descriptor the runner passed for an output file that is not what it must be: the result is forged."""


def read_passed_output(fd: int, size: int) -> bytes:
    """The ``size`` bytes of the output file the runner passed as ``fd``, read once from its start, after the
    descriptor is checked as the runner checked it and more: a regular file with one link, open read-only,
    of exactly ``size`` bytes, in memory (tmpfs or a memfd: ``F_GET_SEALS`` answers only for those, so the
    read never waits on a device, a FIFO or a remote file system). A file whose size moved while it was
    read, or that holds fewer bytes, is refused: PassedOutputRefused says why. The caller closes ``fd``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        raise PassedOutputRefused("a passed output is not a regular file with one link")
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY:
        raise PassedOutputRefused("a passed output is open for writing")
    if info.st_size != size:
        raise PassedOutputRefused(f"a passed output is {info.st_size} bytes, announced {size}")
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise PassedOutputRefused("a passed output is not a file in memory (tmpfs)") from None
    body = os.pread(fd, size, 0)
    if len(body) < size:  # a regular file reads whole; a short read means it shrank meanwhile
        body += _pread_rest(fd, len(body), size)
    if os.fstat(fd).st_size != size:
        raise PassedOutputRefused("a passed output changed its size while it was read")
    return body


def _pread_rest(fd: int, offset: int, size: int) -> bytes:
    parts: list[bytes] = []
    while offset < size and (chunk := os.pread(fd, size - offset, offset)):
        parts.append(chunk)
        offset += len(chunk)
    if offset < size:
        raise PassedOutputRefused(f"a passed output holds {offset} bytes, announced {size}")
    return b"".join(parts)


__all__ = ["InputRefused", "PassedOutputRefused", "read_input", "read_passed_output"]
