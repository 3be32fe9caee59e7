"""An input file named by path (issue 41): read once, on the host, when the request is built, with the rules
every input follows (docs/files.md): a regular file (a FIFO never blocks the open, a device is refused before
a byte is read), not a symlink (a link could pull in a file the caller did not look at), at most ``limit``
bytes even if it grows while it is read."""

from __future__ import annotations

import errno
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


__all__ = ["InputRefused", "read_input"]
