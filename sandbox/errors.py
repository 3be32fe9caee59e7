"""The sandbox layer's own exception, in a neutral room: backends raise it, and the modules they share
(protections, the engine clients) raise it too without importing a backend."""

from __future__ import annotations


class SandboxUnavailable(Exception):
    """The backend cannot provide a sandbox right now (engine down, image missing, protection absent)."""

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable
