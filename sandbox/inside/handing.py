"""Files handed through a nested call (issue 41): ``handle.call_with_files(method, files, *args, **kwargs)``.

``files`` maps each name the callee will see in its ``inputs/`` to a file of this program's own area:
``"inputs/NAME"`` or ``"outputs/NAME"``, and nothing else (no other directory, no ``..``, no absolute path).
Each is opened the way the collector opens outputs: ``O_NOFOLLOW|O_NONBLOCK``, and the descriptor must be a
regular file with one link. So a symlink, a hard link, a FIFO or a device is refused, not followed. The bytes
travel base64 in the ``call`` frame, bounded by half the frame limit in all; the host then checks them against
the run's ``Limits``. The callee's outputs come back in its ``call_result`` only when it committed, and are
written into this program's ``outputs/``.
"""

from __future__ import annotations

import base64
import os
import stat
from typing import Any

from .files import valid_name

AREAS = ("inputs", "outputs")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def given(files: Any, budget: int) -> dict[str, str]:
    """The files a nested call is handed, as base64 texts; PermissionError for a name or a source outside the
    file area, OSError past ``budget`` bytes in all."""
    if type(files) is not dict:
        raise TypeError("call_with_files(method, files, ...): files is a dict of name -> 'inputs/NAME' or "
                        "'outputs/NAME'")  # fmt: skip
    handed: dict[str, str] = {}
    left = budget
    for name, source in files.items():
        if not valid_name(name):
            raise PermissionError(f"call_with_files: {str(name)[:100]!r} is not a file name")
        area, slash, base = source.partition("/") if type(source) is str else ("", "", "")
        if area not in AREAS or not slash or not valid_name(base):
            raise PermissionError(f"call_with_files: {str(source)[:100]!r} is not a file of inputs/ or outputs/")
        body = _read(f"{area}/{base}", left)
        left -= len(body)
        handed[name] = base64.b64encode(body).decode("ascii")
    return handed


def _read(path: str, most: int) -> bytes:
    fd = os.open(path, _READ)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise PermissionError(f"call_with_files: {path!r} is not a regular file")
        chunks: list[bytes] = []
        got = 0
        while got <= most and (chunk := os.read(fd, min(most + 1 - got, 1 << 20))):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > most:
        raise OSError(f"call_with_files: the files handed on are over {most} bytes in all")
    return b"".join(chunks)


def received(files: Any) -> None:
    """The callee's committed outputs (name -> base64), written into this program's ``outputs/``."""
    if not files:
        return
    if type(files) is not dict:
        raise RuntimeError("host sent malformed files with a nested call's reply")
    for name, text in files.items():
        if not valid_name(name) or type(text) is not str:
            raise RuntimeError("host sent malformed files with a nested call's reply")
        body = base64.b64decode(text, validate=True)
        fd = os.open(f"outputs/{name}", _WRITE, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PermissionError(f"outputs/{name} is not a regular file")
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
