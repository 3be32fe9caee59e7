"""Reading an installed ``site`` directory: which top-level modules each distribution provides, and what the
directory costs on disk (hard links into the uv cache are shared bytes)."""

from __future__ import annotations

import csv
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandforge.runtime.environments.policy import normal_name

_MODULE_SUFFIXES = (".py", ".so", ".pyd")


def provides(site: Path) -> dict[str, tuple[str, ...]]:
    """distribution (PEP 503 name) -> the importable top-level names its RECORD lists."""
    out: dict[str, tuple[str, ...]] = {}
    for info in sorted(site.glob("*.dist-info")):
        record = info / "RECORD"
        dist = info.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        if not record.is_file():
            continue
        names: set[str] = set()
        for row in csv.reader(io.StringIO(record.read_text(encoding="utf-8", errors="replace"))):
            if row and (name := _top_level(row[0])) is not None:
                names.add(name)
        out[normal_name(dist)] = tuple(sorted(names))
    return out


def _top_level(path: str) -> str | None:
    parts = path.split("/")
    head = parts[0]
    if head.endswith((".dist-info", ".data")) or head in ("__pycache__", "..", "bin") or not head:
        return None
    if len(parts) > 1:
        return head if head.isidentifier() else None
    for suffix in _MODULE_SUFFIXES:
        if head.endswith(suffix):
            module = head.split(".", 1)[0]
            return module if module.isidentifier() else None
    return None


@dataclass(frozen=True)
class DiskUse:
    files: int
    size_bytes: int
    unshared_bytes: int  # in files with one link (not shared with the uv cache or another environment)


def disk_use(root: Path) -> DiskUse:
    files = size = unshared = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            info = (Path(directory) / name).lstat()
            files += 1
            size += info.st_size
            if info.st_nlink == 1:
                unshared += info.st_size
    return DiskUse(files, size, unshared)


def open_up(root: Path) -> None:
    """Make the tree readable by every user (the sandbox runs as another uid) and writable by none but the
    owner: directories 0755, files 0644 (0755 when executable)."""
    for directory, _dirs, names in os.walk(root):
        Path(directory).chmod(0o755)
        for name in names:
            path = Path(directory) / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode):
                path.chmod(0o755 if mode & 0o111 else 0o644)
