"""A tenant's stored files (issue 41): what it uploaded (``POST /v1/files``) and the committed outputs of its
runs, each kept under its state directory until deleted or older than the tenant's ``stored_file_max_age_s``.

Each file is two state files below ``<state_dir>/files``: ``<id>.bin`` (the bytes) and ``<id>.json`` (what is
said of it), each written atomically with the project's rules (``runtime/files``: 0600, temp file + fsync +
rename, no symlink followed). The bytes are written first: a record names a file that is whole. A file's id is
128 random bits, so knowing one is no way to guess another, and a store is rooted in one tenant's directory,
so another tenant's id is simply not found. A put holds the store's lock (a lock file: ``serve`` and
``sandforge mcp`` may share one tenant) while it checks the quota (count and bytes) and writes. Files past
their age are removed when the store is opened (start-up) and on every access.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files import exclusive, read_state_file, write_state_file
from sandforge.runtime.files.dirs import open_dir_below, split_below
from sandforge.runtime.files.transfer import media_type
from sandforge.runtime.service.spool import PARTS, STALE_PART_S, Spool
from sandforge.sandbox import Limits

FILE_ID = re.compile(r"^f_[0-9a-f]{32}$")
#: The MCP resource of a stored file; ``file_refs`` take this URI or the bare id.
FILE_URI = "sandforge://files/{id}"
_URI_PREFIX = "sandforge://files/"
_RECORD_MAX = 4096


class StoreFull(SandforgeError):
    """A put over the tenant's stored-file quota (count or bytes)."""


class BadReference(SandforgeError):
    """A ``file_refs`` the run cannot take: one line saying which name and why."""


class StoredFile(BaseModel):
    """What is said of one stored file: never its bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    size: int
    sha256: str
    media_type: str
    kind: Literal["upload", "output"]
    created: datetime

    @property
    def url(self) -> str:
        return f"/v1/files/{self.id}"

    def listed(self) -> dict[str, object]:
        return {**self.model_dump(mode="json"), "url": self.url, "uri": FILE_URI.format(id=self.id)}


def file_id_of(ref: str) -> str | None:
    """The id a reference names (an id or ``sandforge://files/ID``), or None when it names none."""
    ref = ref.removeprefix(_URI_PREFIX)
    return ref if FILE_ID.fullmatch(ref) else None


class UploadStore:
    """One tenant's stored files, bounded by ``max_files`` and ``max_bytes``, cleaned by ``max_age_s``."""

    def __init__(self, state_dir: Path, *, max_files: int, max_bytes: int, max_age_s: float) -> None:
        self.base = state_dir
        self.root = state_dir / "files"
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clean()

    def _records(self) -> list[StoredFile]:
        try:
            names = [e.name for e in os.scandir(self.root) if e.name.endswith(".json")]
        except FileNotFoundError:
            return []
        records = []
        for name in names:
            try:
                raw = read_state_file(self.base, self.root / name, limit=_RECORD_MAX)
                records.append(StoredFile.model_validate_json(raw))
            except (SandforgeError, ValidationError):  # gone meanwhile, or not ours: not a stored file
                continue
        return sorted(records, key=lambda r: (r.created, r.id))

    def clean(self) -> int:
        """Remove every file older than the maximum age (and bytes no record names); how many were removed."""
        cutoff = time.time() - self.max_age_s
        removed = 0
        for record in self._records():
            if record.created.timestamp() < cutoff:
                self._remove(record.id)
                removed += 1
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):  # a put that died between its two writes
                named = self.root / (entry.name.removesuffix(".bin") + ".json")
                stale = entry.name.endswith(".bin") and entry.stat(follow_symlinks=False).st_mtime < time.time() - 60
                if stale and not named.exists():
                    with contextlib.suppress(OSError):
                        Path(entry.path).unlink()
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root / PARTS):  # a receiver that died (a crash, a kill) left its part
                if entry.stat(follow_symlinks=False).st_mtime < time.time() - STALE_PART_S:
                    with contextlib.suppress(OSError):
                        Path(entry.path).unlink()
        return removed

    def files(self) -> list[StoredFile]:
        self.clean()
        return self._records()

    def spool(self, name: str, limit: int) -> Spool:
        """A new file being received as ``name`` (a checked file name), at most ``limit`` bytes: written to a
        private temp file of this store as it arrives, stored by :meth:`commit` only once whole."""
        return Spool(self.base, self.root / PARTS, name, limit)

    def commit(self, spools: Sequence[Spool], kind: Literal["upload", "output"]) -> list[StoredFile]:
        """Store every spooled file or none, each appearing whole (a rename): the quota (count, bytes) is checked
        under the store's lock against what is stored at that moment, so uploads racing each other never take the
        store past it (StoreFull, nothing stored). The spools are discarded either way."""
        self.clean()
        stored: list[StoredFile] = []
        try:
            with exclusive(self.root / "store"):
                records = self._records()
                if len(records) + len(spools) > self.max_files:
                    raise StoreFull(f"this tenant's stored files are at their limit of {self.max_files} files")
                used, adding = sum(r.size for r in records), sum(s.size for s in spools)
                if used + adding > self.max_bytes:
                    raise StoreFull(f"{adding} bytes would take this tenant's stored files over {self.max_bytes} "
                                    f"bytes ({used} used)")  # fmt: skip
                for spool in spools:
                    record = StoredFile(id="f_" + secrets.token_hex(16), name=spool.name, size=spool.size,
                                        sha256=spool.sha256, media_type=media_type(spool.name), kind=kind,
                                        created=datetime.now(UTC))  # fmt: skip
                    spool.move_to(self.root / f"{record.id}.bin")
                    stored.append(record)
                    write_state_file(self.base, self.root / f"{record.id}.json", record.model_dump_json().encode())
        except BaseException:
            for record in stored:
                self._remove(record.id)
            raise
        finally:
            for spool in spools:
                spool.discard()
        return stored

    def put_all(self, files: Iterable[tuple[str, bytes]], kind: Literal["upload", "output"]) -> list[StoredFile]:
        """Store every file (bytes already in memory: a run's outputs) or none (StoreFull over the quota)."""
        spools: list[Spool] = []
        try:
            for name, body in files:
                spools.append(self.spool(name, len(body)))
                spools[-1].write(body)
        except BaseException:
            for spool in spools:
                spool.discard()
            raise
        return self.commit(spools, kind)

    def put(self, name: str, body: bytes, kind: Literal["upload", "output"] = "upload") -> StoredFile:
        """Store ``body`` as ``name`` (a checked file name); StoreFull over the quota, nothing written."""
        return self.put_all([(name, body)], kind)[0]

    def info(self, file_id: str) -> StoredFile | None:
        self.clean()
        if not FILE_ID.fullmatch(file_id):
            return None
        try:
            return StoredFile.model_validate_json(
                read_state_file(self.base, self.root / f"{file_id}.json", limit=_RECORD_MAX)
            )
        except (SandforgeError, ValidationError):
            return None

    def read(self, file_id: str) -> tuple[StoredFile, bytes] | None:
        """A file's record and bytes, or None when this tenant has no such file."""
        record = self.info(file_id)
        if record is None:
            return None
        try:
            body = read_state_file(self.base, self.root / f"{file_id}.bin", limit=record.size)
        except SandforgeError:
            return None
        return record, body

    def open(self, file_id: str) -> tuple[StoredFile, BinaryIO] | None:
        """A file's record and its bytes open for reading (a download streams them), or None when this tenant
        has no such file. Opened as a state file is read: no symlink followed, a regular file of its size."""
        record = self.info(file_id)
        if record is None:
            return None
        try:
            dfd = open_dir_below(self.base, split_below(self.base, self.root), create=False)
            try:
                fd = os.open(f"{file_id}.bin", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError:
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != record.size:
            os.close(fd)
            return None
        return record, os.fdopen(fd, "rb")

    def referenced(self, refs: Mapping[str, str], inline: Mapping[str, object], limits: Limits) -> dict[str, bytes]:
        """The input files ``refs`` names (name -> an id or ``sandforge://files/ID``), within ``limits`` (count,
        each, total: checked on the records, before a byte is read). BadReference for a name also given
        ``inline``, a reference to no file of this tenant (another tenant's id is not found, as a made-up one
        is), or a bound broken."""
        if len(refs) + len(inline) > limits.max_files:
            raise BadReference(f"{len(refs) + len(inline)} input files; the limit is {limits.max_files}")
        records: dict[str, StoredFile] = {}
        total = 0
        for name, ref in refs.items():
            if name in inline:
                raise BadReference(f"file_refs.{name}: this input file is also given in files")
            file_id = file_id_of(ref)
            record = self.info(file_id) if file_id is not None else None
            if record is None:
                raise BadReference(f"file_refs.{name}: no such stored file")
            total += record.size
            if record.size > limits.max_file_bytes or total > limits.max_files_bytes:
                raise BadReference(f"file_refs.{name}: over the input files' limits ({limits.max_file_bytes} bytes "
                                   f"each, {limits.max_files_bytes} in all)")  # fmt: skip
            records[name] = record
        files: dict[str, bytes] = {}
        for name, record in records.items():
            found = self.read(record.id)
            if found is None:
                raise BadReference(f"file_refs.{name}: no such stored file")
            files[name] = found[1]
        return files

    def find(self, sha256: str, name: str) -> StoredFile | None:
        """The newest stored output named ``name`` with this content (a call record names its outputs so)."""
        matches = [r for r in self.files() if r.sha256 == sha256 and r.name == name and r.kind == "output"]
        return matches[-1] if matches else None

    def delete(self, file_id: str) -> bool:
        if self.info(file_id) is None:
            return False
        self._remove(file_id)
        return True

    def _remove(self, file_id: str) -> None:
        for suffix in (".json", ".bin"):  # the record first: a reader never finds a record without its bytes
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{file_id}{suffix}").unlink()
