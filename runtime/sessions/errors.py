"""Typed errors of the session layer (printed by the CLI as one `error:` line, never a traceback)."""

from __future__ import annotations

from sandforge.runtime.errors import FileIOError, SandforgeError


class SessionError(SandforgeError):
    """Base of every session-layer error."""


class SessionNotFoundError(SessionError):
    """No session with that id (or the prefix matches none, or several)."""


class SessionStoreError(SessionError):
    """The session database cannot be opened, read or written."""


class SessionStoreIOError(SessionStoreError, FileIOError):
    """The database file cannot be created, or written (disk full, read-only file system): exit 5."""


class CorruptDatabaseError(SessionStoreError):
    """The session database file is not a usable SQLite database."""


class SchemaTooNewError(SessionStoreError):
    """The database was written by a newer sandforge; this one refuses to touch it."""


class ChatProviderError(SessionError):
    """The chat model could not be called or answered with something unusable."""

    def __init__(self, message: str, *, retriable: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retriable = retriable


class ScriptExhaustedError(ChatProviderError):
    """The scripted chat provider was asked for more turns than its script holds."""
