"""A read-only hand-off directory: large context values reach a Docker-run container as files, not as bytes
pushed through the engine.

Frames to a container started by dockerd travel client -> dockerd -> containerd-shim -> a fifo -> the
container's stdin: for 10 MB, many times what an empty execution costs, under runc and more under gVisor
(docs/benchmarks.md, "Numbers behind the code"). Sealed memfds (what the subprocess and runc backends pass)
cannot cross that path. Instead each container gets a fresh, empty host directory bind-mounted read-only at
``MOUNT_POINT``; before the execute frame is sent, each large value is put there as ``<index>``, and the frame
announces it as ``[key, length, index]`` exactly as it would a passed descriptor. The runner opens and maps the file
read-only, so a value the program never reads costs the runner nothing. The host makes each value's file
once per snapshot key, in this process's private store, and hard-links it into each container's directory:
carrying an unchanged 10 MB value costs a link, not a 10 MB write.

What crosses is still only the JSON text the frame would have carried, and nothing else is visible: the
directory belongs to one container, is removed with it, and holds only that execution's values. It lives in
a private (0700) parent, so other host users cannot reach it; inside, it is 0711 with 0444 files, so the
container's unprivileged user can open (not list or change) them, and the mount is read-only in any case.
The runner uses the directory only after reading back a random token the host wrote there, so an engine
that cannot see the host's path (a remote daemon) falls back to frames.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import stat
import tempfile
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from sandforge.sandbox.inside.wire import HANDOFF_PROOF_FILE
from sandforge.sandbox.ownership import process_tag, tag_alive

if TYPE_CHECKING:
    from sandforge.sandbox.context import ContextSnapshot

#: Where the directory appears inside the container (read-only).
MOUNT_POINT = "/sandforge/in"
#: The file holding the random value that proves the runner sees this host directory.
PROOF_FILE = HANDOFF_PROOF_FILE
#: Host directories are named ``<PREFIX><pid>-<start time>-<random>``: the reaper can tell whose they are.
PREFIX = "sandforge-handoff-"


def base_dir() -> Path:
    """Memory-backed when possible: a value's file is written once and read (mapped) at most once."""
    shm = Path("/dev/shm")  # noqa: S108
    return shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())


class StoredText:
    """One context key's text as a read-only file in this process's store, made once per snapshot key (see
    ``ContextSnapshot.shared``) and hard-linked, not copied, into each container's directory."""

    __slots__ = ("__weakref__", "path")

    def __init__(self, text: bytes) -> None:
        fd, name = tempfile.mkstemp(dir=_store())
        self.path = Path(name)
        try:
            _write_all(fd, text)
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        weakref.finalize(self, self.path.unlink, missing_ok=True)


_STORE: tuple[int, Path] | None = None
_STORE_LOCK = threading.Lock()


def _store() -> Path:
    """This process's store (0700), beside the containers' directories so that a file can be linked."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None or _STORE[0] != os.getpid():
            root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{process_tag()}-", dir=base_dir()))
            _STORE = (os.getpid(), root)
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        return _STORE[1]


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a new file and make it read-only for everyone (whatever the umask); closes ``fd``."""
    try:
        os.fchmod(fd, 0o444)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class HandoffDir:
    """One container's hand-off directory on the host: ``path`` is what gets mounted."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{process_tag()}-", dir=base_dir()))
        self.path = self.root / "in"
        self.token = secrets.token_hex(16)
        try:
            self.path.mkdir()
            self.path.chmod(0o711)  # the container's user may open files in it, not list it
            self._write(PROOF_FILE, self.token.encode())
        except BaseException:
            self.remove()
            raise

    def put(self, index: int, context: ContextSnapshot, key: str) -> None:
        """``key``'s text as value ``index`` of the next execute frame: linked from the store when it can
        be, written otherwise. OSError (e.g. no space left) means: send it as a frame."""
        stored = context.shared(key, StoredText)
        if stored is not None:
            with contextlib.suppress(OSError):
                os.link(stored.path, self.path / str(index))
                return
        self._write(str(index), context[key])

    def put_bytes(self, index: int, data: bytes) -> None:
        """``data`` (an input file's bytes) as file ``index`` of the next execute frame; OSError (e.g. no space
        left) means: send it as a frame."""
        self._write(str(index), data)

    def _write(self, name: str, data: bytes) -> None:
        target = self.path / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        try:
            _write_all(fd, data)
        except BaseException:
            target.unlink(missing_ok=True)
            raise

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def reap() -> list[Path]:
    """Remove this user's hand-off directories whose process is gone (killed before it could clean up)."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in base_dir().iterdir():
            if not entry.name.startswith(PREFIX):
                continue
            tag = entry.name[len(PREFIX) :].rsplit("-", 1)[0]
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not tag_alive(tag):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
    return removed


__all__ = ["MOUNT_POINT", "PREFIX", "PROOF_FILE", "HandoffDir", "StoredText", "base_dir", "reap"]
