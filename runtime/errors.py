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
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(SandforgeError):
    """Bad command-line input: wrong flag values, unreadable files, malformed JSON arguments."""

    exit_code = 2


class ConfigError(SandforgeError):
    """A configuration or policy file is malformed; the message names the file and the line."""

    exit_code = 2
