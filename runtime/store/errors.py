"""Typed errors of the ToolStore. All derive from :class:`runtime.errors.SandforgeError`.

Corrupt files are *not* errors: they are quarantined and the run goes on (see ``runtime.store.record_files``).
These errors are for conditions the caller must see: data written by a newer sandforge, a lock that cannot
be taken, a name that cannot be stored, an unknown tool on the command line, a refused rollback.
"""

from __future__ import annotations

from pathlib import Path

from sandforge.runtime.errors import FileIOError, SandforgeError


class StoreError(SandforgeError):
    """Base of every ToolStore error."""


class SchemaTooNewError(StoreError):
    """A record was written by a newer sandforge; this version refuses to read (and so to overwrite) it."""

    def __init__(self, path: Path, kind: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path}: {kind} has schema_version {found}, this sandforge reads up to {supported}",
            hint="upgrade sandforge, or point --store / SANDFORGE_STATE_DIR at another directory",
        )
        self.path = path
        self.kind = kind
        self.found = found
        self.supported = supported


class StoreLockTimeout(StoreError):
    """Another process held the store lock for longer than the configured timeout."""


class InvalidNameError(StoreError):
    """A role or method name that cannot be stored (lone surrogates: not encodable as UTF-8)."""


class ToolNotFoundError(StoreError):
    """The named role, or method of a role, is not in the store."""


class RollbackError(StoreError):
    """A rollback was refused: no such generation, already current, or the target failed its checksum."""


class StoreIOError(StoreError, FileIOError):
    """The store directory could not be written (permissions, disk full, read-only file system, a symlink
    in the way). Exit status 5, like every FileIOError."""
