"""Trace and call identifiers, in a module of their own so a run's record (``runtime.agent.runs``: ``sandforge
exec``) names its call without loading the lifecycle's port (``env``: state, SQLite, providers; issue 39)."""

from __future__ import annotations

import uuid


def new_id() -> str:
    return uuid.uuid4().hex[:16]
