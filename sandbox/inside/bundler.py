"""Write the runner's start-up bundle (``bundle.py``): run once by the image build (``images/Dockerfile``), in
the image, never by a runner."""

from __future__ import annotations

import marshal
import sys
from typing import Any

from .bundle import MAGIC, bundle_path

_external: Any = sys.modules["_frozen_importlib_external"]


def runner_imports() -> None:
    """Import what a container's runner imports before lock-down (``start``, then ``serving.prepare`` of a
    container's boot frame: RestrictedPython, the internal imports, asyncio, the stand-ins, a warm
    compiler)."""
    from . import start  # noqa: F401 - the entry point's imports
    from .serving import prepare

    prepare({"sys_path": [bundle_path().rpartition("/")[0] + "/lib"], "chroot": False})


def build(path: str | None = None) -> int:
    """Write the bundle (run by the image build, in the image): every pure-Python module a runner imports
    before lock-down whose compiled file is current (a timestamp ``.pyc`` whose header matches its source), and
    where each extension module it imports lives, in name order; the number of modules indexed."""
    runner_imports()
    modules = sorted(sys.modules)  # before this function's own imports: only what a runner imports
    from pathlib import Path

    index: dict[str, tuple[str, bool, int, int]] = {}
    blobs: list[bytes] = []
    offset = 0
    for name in modules:
        spec = getattr(sys.modules[name], "__spec__", None)
        source, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if isinstance(source, str) and source.endswith(tuple(_external.EXTENSION_SUFFIXES)):
            index[name] = (source, False, -1, 0)  # where it is; loaded from its file
            continue
        if name in (__name__, f"{__package__}.bundle") or not (
            isinstance(source, str) and source.endswith(".py") and isinstance(cached, str)
        ):
            continue  # built-in or frozen modules; this one and ``bundle`` (imported before it is installed)
        if not Path(cached).is_file():
            continue
        pyc = Path(cached).read_bytes()
        stat = Path(source).stat()
        header = (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
        if pyc[4:8] != bytes(4) or header != (
            int.from_bytes(pyc[8:12], "little"),
            int.from_bytes(pyc[12:16], "little"),
        ):
            continue  # hash-based or stale: left to the ordinary import system
        index[name] = (source, getattr(spec, "submodule_search_locations", None) is not None, offset, len(pyc))
        blobs.append(pyc)
        offset += len(pyc)
    header_bytes = marshal.dumps(index)
    Path(path or bundle_path()).write_bytes(
        MAGIC + len(header_bytes).to_bytes(8, "big") + header_bytes + b"".join(blobs)
    )
    return len(index)


__all__ = ["build", "runner_imports"]
