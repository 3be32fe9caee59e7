"""Directories sandforge creates are private (0700, every level it makes), and below a state directory no
component is ever a symlink: each one is opened with ``O_NOFOLLOW`` relative to its parent's descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from sandforge.runtime.errors import InputFileError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class SymlinkRefused(InputFileError):
    """A symlink below a state directory, where sandforge never puts one."""


def make_dirs(path: Path) -> None:
    """``mkdir -p`` that makes every missing level 0700 (``Path.mkdir`` applies the mode to the last only)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(0o700)


def open_dir_below(base: Path, relative: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of ``base/relative...``, every component below ``base`` opened with ``O_NOFOLLOW``.

    ``base`` itself is trusted (it may be a symlink the user set up). With ``create``, missing directories
    are made 0700. A symlink (or a non-directory) below ``base`` raises SymlinkRefused.
    """
    if create:
        make_dirs(base)
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in relative:
            if part in ("", ".", "..") or "/" in part:
                raise SymlinkRefused(f"{base}: refusing path component {part!r}")
            while True:
                try:
                    nfd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                    break
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):  # made by another process meanwhile: open it
                        os.mkdir(part, 0o700, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise SymlinkRefused(
                            f"{base.joinpath(*relative)}: {part} is a symlink or not a directory; "
                            "sandforge refuses links inside its state directory"
                        ) from None
                    raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def split_below(base: Path, path: Path) -> tuple[str, ...]:
    """``path``'s components below ``base`` (ValueError if it is not below it)."""
    parts = path.relative_to(base).parts
    if not parts:
        raise ValueError(f"{path} is {base} itself, not a file below it")
    return parts
