"""Where sandforge keeps its state (tool store, sessions database, call log): resolved in one place.

The tool store (``runtime.store.paths``), the sessions database (``runtime.sessions.db``) and the call log
(``runtime.agent.calllog``) all live below the same directory, so they must agree on it.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "SANDFORGE_STATE_DIR"
APP_NAME = "sandforge"


def resolve_state_dir(override: Path | str | None = None) -> Path:
    """``override``, else ``$SANDFORGE_STATE_DIR`` (blank counts as unset), else the platform's user state
    directory for sandforge. ``~`` is expanded in the first two."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get(STATE_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    import platformdirs  # only without an explicit directory

    return platformdirs.user_state_path(APP_NAME)
