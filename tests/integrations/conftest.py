"""The framework tests' fixture: two sessions on one store directory (``sessions.py``)."""

from tests.integrations.sessions import sessions

__all__ = ["sessions"]
