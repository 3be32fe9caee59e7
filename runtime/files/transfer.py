"""Files in the transaction (issue 41) at the host's edges: the input files a caller names, read and checked
before any sandbox starts, and the output files of an ok run, committed to a directory all or nothing.

Inputs follow the bounded-read rules (``read.py``) with one difference: a symlink is refused, not followed
(``--file``/``--files`` name what goes into the sandbox; a link could pull in a file the caller did not
look at). Every refusal is one ``InputFileError`` line (exit 2): a bad name, too many files, one over its
bound or all of them over theirs, a symlink, a FIFO or device, a directory, an unreadable file.

Outputs are staged as temp files (``O_EXCL|O_NOFOLLOW``, fsynced) and only then renamed into place. A new
directory is staged whole beside its final name and renamed in one step, so a reader sees all the files or
none; into an existing directory each file replaces its name atomically after every one was staged, and a
failure before that removes every staged file. Names were checked on both sides of the boundary already
(``sandbox.protocol.FileName``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandforge.runtime.errors import FileIOError, InputFileError
from sandforge.runtime.files.read import file_kind
from sandforge.runtime.files.write import io_error
from sandforge.sandbox.files import InputRefused, read_input
from sandforge.sandbox.inside.wire import FILE_NAME_PATTERN
from sandforge.sandbox.protocol import Limits

_NAME = re.compile(FILE_NAME_PATTERN)
#: What a caller may hand in for one file: its bytes, or the path of a regular file to read.
FileSource = bytes | str | os.PathLike[str]


def check_name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise InputFileError(
            f"{where}: {name[:100]!r} is not a valid file name (one path segment matching {FILE_NAME_PATTERN}; "
            "no '/', no leading dot)"
        )
    return name


def read_input_file(path: Path, *, limit: int) -> bytes:
    """One input file: a regular file (not a symlink, FIFO, device or directory), at most ``limit`` bytes."""
    try:
        return read_input(path, limit)
    except InputRefused as exc:
        raise InputFileError(str(exc)) from None


def input_files(sources: Mapping[str, FileSource], limits: Limits) -> dict[str, bytes]:
    """The files for ``ExecutionRequest.files``: each name checked, each path read, every bound held."""
    if len(sources) > limits.max_files:
        raise InputFileError(f"{len(sources)} input files; the limit is {limits.max_files}")
    files: dict[str, bytes] = {}
    total = 0
    for name, source in sources.items():
        check_name(name, "input file")
        limit = limits.max_file_bytes
        body = bytes(source) if isinstance(source, bytes) else read_input_file(Path(source), limit=limit)
        if len(body) > limits.max_file_bytes:
            raise InputFileError(f"input file {name!r} is {len(body)} bytes, over the limit of {limits.max_file_bytes}")
        total += len(body)
        if total > limits.max_files_bytes:
            raise InputFileError(f"the input files are over the limit of {limits.max_files_bytes} bytes in all")
        files[name] = body
    return files


def directory_sources(directory: Path) -> dict[str, Path]:
    """Each entry of ``directory`` (not recursive) as an input file named after it; an entry that is not
    a regular file is refused when it is read."""
    try:
        names = sorted(entry.name for entry in os.scandir(directory))
    except OSError as exc:
        raise InputFileError(f"cannot list input directory {directory}: {exc.strerror or exc}") from None
    return {check_name(name, f"input directory {directory}"): directory / name for name in names}


def read_files_options(pairs: tuple[str, ...], directory: Path | None, limits: Limits) -> dict[str, bytes]:
    """``--file NAME=PATH`` (repeatable) and ``--files DIR`` as input files; a name given twice is refused."""
    sources: dict[str, FileSource] = dict(directory_sources(directory)) if directory is not None else {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise InputFileError(f"--file {pair[:100]!r}: expected NAME=PATH")
        if name in sources:
            raise InputFileError(f"--file {name!r}: this input file is given twice")
        sources[check_name(name, "--file")] = path
    return input_files(sources, limits)


def commit_output_files(directory: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Write ``files`` into ``directory``, all or nothing (see the module's doc); the paths written.
    FileIOError (exit 7) when they cannot be, with nothing written."""
    for name in files:
        check_name(name, "output file")
    try:
        if not directory.exists():
            _commit_new(directory, files)
        else:
            _commit_into(directory, files)
    except OSError as exc:
        raise io_error("write output files to", directory, exc) from None
    return [directory / name for name in files]


def _commit_new(directory: Path, files: Mapping[str, bytes]) -> None:
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = parent / f".{directory.name[:100]}.{secrets.token_hex(6)}.tmp"
    staging.mkdir(mode=0o700)
    try:
        dfd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name, body in files.items():
                _stage(dfd, name, body)
                os.rename(f".{name}.staged", name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)
        staging.rename(directory)  # fails (ENOTEMPTY) if another writer filled it meanwhile
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _commit_into(directory: Path, files: Mapping[str, bytes]) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    staged: list[str] = []
    try:
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    raise FileIOError(f"cannot write {directory / name}: it is {file_kind(info.st_mode)}; nothing "
                                      "was written")  # fmt: skip
        for name, body in files.items():
            staged.append(name)
            _stage(dfd, name, body)
        for name in files:  # each a rename within one directory: atomic, and nothing left to fail on
            os.rename(f".{name}.staged", name, src_dir_fd=dfd, dst_dir_fd=dfd)
        staged.clear()
        os.fsync(dfd)
    finally:
        for name in staged:
            with contextlib.suppress(OSError):
                os.unlink(f".{name}.staged", dir_fd=dfd)
        os.close(dfd)


def _stage(dfd: int, name: str, body: bytes) -> None:
    fd = os.open(f".{name}.staged", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dfd)  # fmt: skip
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def media_type(name: str) -> str:
    """A file's media type by its name's extension (``application/octet-stream`` when unknown)."""
    import mimetypes  # its tables would cost every importer of the service models at start-up

    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


def manifest(files: Mapping[str, bytes], *, content: bool = False) -> list[dict[str, Any]]:
    """What is said of committed files: name, size, sha256, media type (by the name, checked against the bytes:
    ``runtime.files.media``), what a call log records (never the contents), and with ``content`` their bytes as
    base64 (an HTTP answer inlines them)."""
    from sandforge.runtime.files.media import labelled  # expat and the JSON parser: only when files are listed

    return [
        {"name": name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest(),
         "media_type": labelled(media_type(name), body),
         **({"content_b64": base64.b64encode(body).decode()} if content else {})}
        for name, body in files.items()
    ]  # fmt: skip
