"""Where the store lives and how any role or method string becomes a safe file name.

Layout (ADR 0012 section 9, plus pattern memory of ADR 0013)::

    <state_dir>/tools/
      registry.sqlite               every tool: contract + usage, one row per tool (runtime.store.registry_db)
      registry.json.migrated        the registry of before the rows (registry.json), kept after its migration
      patterns.json                 capability-pattern memory (rolling window per role)
      <role-dir>/manifest.json      the role's contract and its methods (name -> file)
      <role-dir>/<method>.json      current artifact + the previous two generations
      .archive/<timestamp>/...      pruned tools (moved here, never deleted outright)
      .store.lock, .patterns.lock   inter-process locks (filelock)

Names are *hashed*, not reversible: ``<slug>-<16 hex of sha256(name)>``. The slug (lower-case ASCII
letters, digits, ``_``; at most 40 characters) is only there for humans; the hash makes the name unique.
Consequences, each covered by a test:

- no path traversal: the result never contains ``/``, ``\\``, ``..``, a leading dot or a NUL;
- case collisions: ``Web`` and ``web`` differ in their hash, so they stay apart even on case-insensitive
  file systems (the slug is lower-cased on purpose);
- very long names: the file name is at most 57 bytes;
- unicode: kept in the records, dropped (transliterated when possible) from the slug;
- a method named ``manifest`` is ``manifest-<hash>.json``, never ``manifest.json``.

The original strings are stored inside the files (and the manifest maps method names to files), and a
loaded record whose stored name differs from the requested one is treated as corrupt.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store.errors import InvalidNameError

TOOLS_DIR_NAME = "tools"
SLUG_MAX = 40
DIGEST_HEX = 16

_UNSAFE = re.compile(r"[^a-z0-9]+")


def check_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it can be stored (any str encodable as UTF-8), else raise InvalidNameError."""
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} must be a string, got {type(name).__name__}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidNameError(f"{what} {name!r} is not valid unicode (lone surrogate)") from exc
    return name


def safe_component(name: str) -> str:
    """A file-system-safe, collision-free path component for any string (see the module docstring)."""
    check_name(name)
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:DIGEST_HEX]
    ascii_form = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii").lower()
    slug = _UNSAFE.sub("_", ascii_form).strip("_")[:SLUG_MAX].strip("_") or "_"
    return f"{slug}-{digest}"


def store_root(path: Path) -> Path:
    """The ``tools`` directory that ``path`` lies below: the trusted base of every store file.

    Every name the store makes below ``tools/`` is fixed (``registry.sqlite``, ``.archive``), a
    ``<slug>-<hash>`` component or a timestamp, never ``tools`` itself, so the nearest ancestor with that
    name is the store's root; below it no symlink is followed (``runtime.files``).
    """
    for parent in path.parents:
        if parent.name == TOOLS_DIR_NAME:
            return parent
    raise ValueError(f"{path} is not inside a {TOOLS_DIR_NAME}/ directory")


def default_state_dir() -> Path:
    """``$SANDFORGE_STATE_DIR`` if set, else the platform's user state directory (``runtime.state_dir``)."""
    return resolve_state_dir()


class StorePaths:
    """Every path of one store, derived from the state directory. Pure: touches no file."""

    def __init__(self, state_dir: Path | str | None = None) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.tools = self.state_dir / TOOLS_DIR_NAME

    @property
    def registry(self) -> Path:
        return self.tools / "registry.sqlite"

    @property
    def legacy_registry(self) -> Path:
        """``registry.json``: the registry as one document, migrated into :attr:`registry` once."""
        return self.tools / "registry.json"

    @property
    def patterns(self) -> Path:
        return self.tools / "patterns.json"

    @property
    def store_lock(self) -> Path:
        return self.tools / ".store.lock"

    @property
    def patterns_lock(self) -> Path:
        return self.tools / ".patterns.lock"

    @property
    def archive(self) -> Path:
        return self.tools / ".archive"

    def role_dir(self, role: str) -> Path:
        return self.tools / safe_component(role)

    def manifest(self, role: str) -> Path:
        return self.role_dir(role) / "manifest.json"

    @staticmethod
    def method_file_name(method_name: str) -> str:
        return f"{safe_component(method_name)}.json"

    def method_file(self, role: str, method_name: str) -> Path:
        return self.role_dir(role) / self.method_file_name(method_name)
