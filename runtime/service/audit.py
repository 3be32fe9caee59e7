"""The audit log: one JSON line per request to /v1 (and /mcp): who called what, when, with which outcome.

Records never hold request bodies, tokens or values (those stay in the tenant's own call log); a request
without a valid token is recorded with ``tenant: null``. Lines are appended with O_APPEND under a lock, the
file created 0600; a write that fails is logged and never fails the request.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files import make_private_dir

log = logging.getLogger(__name__)


class AuditRecord(BaseModel):
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    request_id: str
    tenant: str | None = Field(description="the authenticated tenant; null when authentication failed")
    method: str
    path: str
    status: int = Field(description="the HTTP status answered")
    outcome: str | None = Field(None, description="ok, or the error type (of the response or the outcome)")
    duration_ms: float
    client: str | None = None


class AuditLog:
    """Appends :class:`AuditRecord` lines to ``path`` (None: records are only kept in memory, for tests)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._dir_made = False
        self.count = 0

    def write(self, record: AuditRecord) -> None:
        line = (record.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            self.count += 1
            if self.path is None:
                return
            try:
                if not self._dir_made:
                    make_private_dir(self.path.parent)
                    self._dir_made = True
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.error("cannot append to the audit log: %s", exc.strerror or exc)
            except SandforgeError as exc:  # its directory could not be made
                log.error("cannot append to the audit log: %s", exc)
