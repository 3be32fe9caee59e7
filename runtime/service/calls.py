"""Reading a tenant's call log for ``GET /v1/calls``: bounded lines, regular files only, filters as in
``sandforge logs`` (role, status, trace prefix, the last N)."""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path
from typing import Any

from sandforge.runtime.agent.calllog import parse_record

#: a call record is bounded; a longer line is not one and is skipped unread
MAX_LINE_BYTES = 4 * 1024 * 1024


def select(
    path: Path, *, last: int, role: str | None = None, status: str | None = None, trace: str | None = None
) -> list[dict[str, Any]]:
    """The last ``last`` records matching every filter given, oldest first, as JSON objects."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        selected: deque[dict[str, Any]] = deque(maxlen=last)
        while line := fh.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                while line and not line.endswith(b"\n"):
                    line = fh.readline(MAX_LINE_BYTES)
                continue
            record = parse_record(line.decode("utf-8", "replace"))
            if record is None:
                continue
            if role is not None and record.role != role:
                continue
            if status is not None and record.status != status:
                continue
            if trace is not None and not record.trace_id.startswith(trace):
                continue
            selected.append(record.model_dump(mode="json"))
    return list(selected)
