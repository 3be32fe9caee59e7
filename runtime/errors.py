"""Typed errors a user (or a deployment) can cause. The CLI prints them as one line, never a traceback."""

from __future__ import annotations


class SandforgeError(Exception):
    """Base of every user-facing error. ``hint`` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        """Always one line (a YAML mark, a path with a newline): the CLI prints it as one ``error:`` line."""
        text = self.message if not self.hint else f"{self.message} (hint: {self.hint})"
        return " ".join(text.split())


class SessionError(SandforgeError):
    """Base of every chat-session error (``runtime.sessions``), the chat providers' too: it lives here so
    that ``runtime.providers.chat`` can derive from it without importing the session layer above it."""


class UsageError(SandforgeError):
    """Bad command-line input: wrong flag values, unreadable files, malformed JSON arguments."""

    exit_code = 2


class ConfigError(SandforgeError):
    """A configuration or policy file is malformed; the message names the file and the line."""

    exit_code = 2


class FileIOError(SandforgeError):
    """A file sandforge must write or lock could not be: disk full, read-only file system, permissions.

    The original file is left as it was. A distinct exit status, so a script can tell "the program
    failed" (1) or "a limit ended it" (5) from "the result could not be saved" (7): runtime/cli/exits.py.
    """

    exit_code = 7


class InputFileError(UsageError):
    """An input file was refused before it was used: missing, not a regular file, over its size bound,
    not UTF-8, or not decodable (exit 2, like every bad input)."""


class InputFileMissing(InputFileError):
    """The input file does not exist (callers that treat a missing file as empty catch this one)."""


class OutputTooLargeError(SandforgeError):
    """What would be printed or committed is over the message limit; nothing was printed or written."""
