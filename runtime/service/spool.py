"""One file received over HTTP, written to disk as it arrives (issue 41): an upload is never held whole in
memory, whatever its size.

A spool is a private temp file (0600, ``O_EXCL|O_NOFOLLOW``) in its store's ``parts`` directory, opened below
the state directory with no symlink followed. Each chunk is bounded before it is written (past ``limit``:
:class:`TooLarge`, and not one byte over the bound reaches the disk) and hashed as it goes. The file becomes a
stored file only by :meth:`Spool.move_to` (fsync, then one rename into the store): a reader never sees part of
one. :meth:`Spool.discard` removes whatever was not moved (an error, a client gone, a quota refusal); a part a
dead process left behind is removed by age (:data:`STALE_PART_S`, when the store is cleaned).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.dirs import open_dir_below, split_below
from sandforge.runtime.files.write import io_error

#: the store's directory of files being received
PARTS = "parts"
#: a part no one wrote to for this long was left by a receiver that died: removed when the store is cleaned
STALE_PART_S = 600.0
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TooLarge(SandforgeError):
    """A received file past its bound: receiving it stopped at the first chunk over the bound."""


class TooMany(TooLarge):
    """More files than a body may hold: receiving stopped at the first part over the count."""


class Spool:
    """One file being received as ``name``, at most ``limit`` bytes (see the module docstring)."""

    def __init__(self, base: Path, parts: Path, name: str, limit: int) -> None:
        self.base = base
        self.name = name
        self.limit = limit
        self.size = 0
        self._hash = hashlib.sha256()
        self.path = parts / f"{secrets.token_hex(16)}.part"
        self._state = "receiving"  # then "whole" (fsynced, closed), "moved" or "discarded"
        with self._parts_dir() as dfd:
            try:
                self._fd = os.open(self.path.name, _FLAGS, 0o600, dir_fd=dfd)
            except OSError as exc:
                raise io_error("create", self.path, exc) from None

    @contextlib.contextmanager
    def _parts_dir(self) -> Iterator[int]:
        try:
            dfd = open_dir_below(self.base, split_below(self.base, self.path.parent), create=True)
        except OSError as exc:
            raise io_error("open directory", self.path.parent, exc) from None
        try:
            yield dfd
        finally:
            os.close(dfd)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def write(self, chunk: bytes | memoryview) -> None:
        """Append a chunk, or TooLarge (nothing of it written) when it would take the file past ``limit``."""
        if self.size + len(chunk) > self.limit:
            raise TooLarge(f"{self.name}: over the limit of {self.limit} bytes")
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise io_error("write", self.path, exc) from None
        self._hash.update(chunk)
        self.size += len(chunk)

    def finish(self) -> None:
        """All of it received: on disk (fsync) and its descriptor closed (a spool waiting for the others of its
        request holds none)."""
        if self._state != "receiving":
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise io_error("write", self.path, exc) from None
        finally:
            os.close(self._fd)
            self._state = "whole"

    def move_to(self, target: Path) -> None:
        """Make the received file ``target`` (below the same state directory) in one rename."""
        self.finish()
        try:
            tfd = open_dir_below(self.base, split_below(self.base, target.parent), create=True)
            try:
                with self._parts_dir() as dfd:
                    os.rename(self.path.name, target.name, src_dir_fd=dfd, dst_dir_fd=tfd)
                self._state = "moved"
                os.fsync(tfd)
            finally:
                os.close(tfd)
        except OSError as exc:
            raise io_error("store", target, exc) from None

    def discard(self) -> None:
        """Remove what was received and not moved; idempotent."""
        if self._state == "receiving":
            os.close(self._fd)
        if self._state in ("receiving", "whole"):
            self._state = "discarded"
            with contextlib.suppress(OSError), self._parts_dir() as dfd:
                os.unlink(self.path.name, dir_fd=dfd)
