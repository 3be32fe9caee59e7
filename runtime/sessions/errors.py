"""Typed errors of the session layer (printed by the CLI as one `error:` line, never a traceback)."""

from __future__ import annotations

from sandforge.runtime.errors import FileIOError, SessionError
from sandforge.runtime.providers.chat import ChatProviderError, ScriptExhaustedError

__all__ = [
    "ChatProviderError", "CorruptDatabaseError", "SchemaTooNewError", "ScriptExhaustedError", "SessionError",
    "SessionNotFoundError", "SessionStoreError", "SessionStoreIOError",
]  # fmt: skip


class SessionNotFoundError(SessionError):
    """No session with that id (or the prefix matches none, or several)."""


class SessionStoreError(SessionError):
    """The session database cannot be opened, read or written."""


class SessionStoreIOError(SessionStoreError, FileIOError):
    """The database file cannot be created, or written (disk full, read-only file system): exit 7."""


class CorruptDatabaseError(SessionStoreError):
    """The session database file is not a usable SQLite database."""


class SchemaTooNewError(SessionStoreError):
    """The database was written by a newer sandforge; this one refuses to touch it."""
