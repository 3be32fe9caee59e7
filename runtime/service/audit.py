"""The audit log: one JSON line per request to /v1 (and /mcp): who called what, when, with which outcome.

Records never hold request bodies, tokens or values (those stay in the tenant's own call log); a request
without a valid token is recorded with ``tenant: null``. Lines are appended with O_APPEND under a lock, the
file created 0600; a write that fails is logged and never fails the request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    mcp_method: str | None = Field(None, description="/mcp: the JSON-RPC method (tools/call, tools/list, ...)")
    mcp_tool: str | None = Field(None, description="/mcp tools/call: the MCP tool's name")
    tool_role: str | None = Field(None, description="the tool role called (agent calls, stored and persisted tools)")
    tool_method: str | None = Field(None, description="the tool method called")


#: What an audit record keeps of names a client chose: enough to read, never a payload.
NAME_MAX = 200


def _name(value: object) -> str | None:
    return value[:NAME_MAX] if isinstance(value, str) and value else None


def mcp_fields(body: bytes) -> dict[str, str | None]:
    """The audit fields of one /mcp request body: the JSON-RPC method and, for ``tools/call``, the tool's name
    (and the role and method ``call_stored_tool`` names). A body that is not one JSON-RPC message gives what
    can be read of it, never an error: the MCP endpoint answers that request itself."""
    try:
        message = json.loads(body) if body else None
    except ValueError:
        return {}
    if not isinstance(message, dict):
        return {}
    fields: dict[str, str | None] = {"mcp_method": _name(message.get("method"))}
    params = message.get("params")
    if fields["mcp_method"] == "tools/call" and isinstance(params, dict):
        fields["mcp_tool"] = _name(params.get("name"))
        arguments = params.get("arguments")
        if fields["mcp_tool"] == "call_stored_tool" and isinstance(arguments, dict):
            fields["tool_role"], fields["tool_method"] = _name(arguments.get("role")), _name(arguments.get("method"))
    return fields


def note(scope_state: dict[str, Any] | None, **fields: str | None) -> None:
    """Add ``fields`` to the audit record of the request whose ``scope["state"]`` this is (a handler that
    learns more than the gatekeeper saw: the role and method behind a persisted MCP tool)."""
    if scope_state is not None:
        scope_state.setdefault("audit", {}).update({k: _name(v) for k, v in fields.items()})


class AuditLog:
    """Appends :class:`AuditRecord` lines to ``path`` (None: records are only kept in memory, for tests).

    The file stays open between writes (one ``write`` per request); it is reopened when it was moved or
    removed (log rotation), which is checked at most every ``REOPEN_CHECK_S`` seconds, and after a failed write.
    """

    REOPEN_CHECK_S = 1.0

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._checked = 0.0
        self.count = 0

    def _open(self) -> int:
        assert self.path is not None
        if self._fd is not None:
            now = time.monotonic()
            if now - self._checked < self.REOPEN_CHECK_S:
                return self._fd
            self._checked = now
            try:
                same = self.path.stat().st_ino == os.fstat(self._fd).st_ino
            except OSError:
                same = False
            if same:
                return self._fd
            self._close()
        make_private_dir(self.path.parent)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        self._fd, self._checked = os.open(self.path, flags, 0o600), time.monotonic()
        return self._fd

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def write(self, record: AuditRecord) -> None:
        line = (record.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            self.count += 1
            if self.path is None:
                return
            try:
                os.write(self._open(), line)
            except OSError as exc:
                self._close()
                log.error("cannot append to the audit log: %s", exc.strerror or exc)
            except SandforgeError as exc:  # its directory could not be made
                log.error("cannot append to the audit log: %s", exc)

    def close(self) -> None:
        with self._lock:
            self._close()
