"""Files in the transaction (issue 41), inside: the input files a request carries, put read-only under
``inputs/`` of the runner's working directory before the program runs; the program's ``open``, whose whole
surface is ``inputs/NAME`` (read) and ``outputs/NAME`` (read and write); and the collection of ``outputs/``
after an ok run, each file checked before its bytes are read into the result.

Only bytes cross the boundary, as frames (the execute frame's ``files``, the result's ``files``): the host
never reads a directory the program could write, so there is no host-side collector to race and no link to
follow. The collector here reads each file through a descriptor opened with ``O_NOFOLLOW | O_NONBLOCK`` and
checks that descriptor (a regular file with one link), not the name, so swapping the name afterwards gains
nothing. The tripwire enforces the same surface independently (``tripwire._code_rules``), for the runner's
frames and a library's (``pandas.read_csv("inputs/x.csv")``, ``savefig("outputs/c.png")``): any other
``open``, and every ``os.*`` that would make a link, still ends the execution.
"""

# ruff: noqa: PTH102, PTH104, PTH108, PTH109, PTH119 - the runner avoids pathlib (import cost)

from __future__ import annotations

import builtins
import contextlib
import os
import re
import stat
from typing import Any

from .channel import (
    Channel,
    FileBody,
    PassedTextError,
    check_passed,
    copy_buffer,
    open_handed_off,
    read_bytes_frame,
    read_exact,
    send_file,
    write_all,
)
from .wire import FILE_NAME_PATTERN, HEADER, INPUTS_DIR, MAX_PASSED_FDS, OUTPUTS_DIR
from .wire import error as _error

_NAME = re.compile(FILE_NAME_PATTERN)
_READ_MODES = frozenset({"r", "rt", "rb", "tr", "br"})
_MODE_CHARS = frozenset("rwaxbt+")
_ANY = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: What the program's ``open`` and its files raise.
_OS_ERRORS = (OSError, FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, UnicodeDecodeError)


def valid_name(name: object) -> bool:
    return type(name) is str and _NAME.fullmatch(name) is not None


class StagedFile:
    """An input file's ``size`` bytes, written from its frame straight onto the sandbox's disk as ``path`` (in
    the working directory) until the file area renames it into ``inputs/``; ``close`` removes it if not."""

    __slots__ = ("path", "size")

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        path, self.path = self.path, ""
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


#: A file's bytes as the runner holds them: in memory (a frame, a small output), left in a file (a passed
#: input, a large output), or staged on the disk (a large input that came as a frame).
Body = bytes | FileBody | StagedFile
#: An output file at least this large is sent from its file, not read into the runner (``collect``); an input
#: file this large that comes as a frame is written to the disk as it arrives (``StagedFile``), and is bounded
#: by the files' limits, not the message's (the host counts it so too: ``exchange.send_execute``).
SENT_FROM_FILE_BYTES = 1 << 16
#: Where a large input's frame is written before the file area exists (``StagedFile``).
_STAGING = ".sandforge-input-"


def receive(
    src: int | Channel, frame: dict[str, Any], budget: int, passed: dict[int, int] | None = None,
    handoff: str | None = None, files_budget: int = 0,
) -> list[tuple[str, Body]]:  # fmt: skip
    """The input files announced by the execute frame: ``[name, length]`` is the next frame after the context
    texts, ``[name, length, i]`` descriptor ``i`` of the execute frame (``passed``, kept by ``read_execute``:
    a sealed memfd) or file ``i`` of the ``handoff`` directory, checked to hold exactly ``length`` bytes.
    A frame of ``SENT_FROM_FILE_BYTES`` or more is written to the disk as it comes (``StagedFile``), within
    ``files_budget`` bytes in all; smaller ones count against the message's ``budget``.
    ValueError for a malformed announcement or a frame of another length, PassedTextError for a descriptor
    that does not match (every descriptor is closed then, and any that was passed and not announced) or a
    file that does not fit the disk."""
    passed = {} if passed is None else passed
    received: list[tuple[str, Body]] = []
    try:
        _receive(src, frame, [budget, files_budget], passed, handoff, received)
        if passed:
            raise PassedTextError(f"{len(passed)} passed descriptors are not announced")
        if isinstance(src, Channel) and src.fds:
            raise PassedTextError("descriptors came with an input file's frame, not with the execute frame")
        return received
    except BaseException:
        release(received)
        raise
    finally:
        for fd in passed.values():
            os.close(fd)
        passed.clear()
        if isinstance(src, Channel):
            for fd in src.take_fds()[0]:
                os.close(fd)


def _receive(
    src: int | Channel, frame: dict[str, Any], budgets: list[int], passed: dict[int, int], handoff: str | None,
    received: list[tuple[str, Body]],
) -> None:  # fmt: skip
    announced = frame.get("files", [])
    if not isinstance(announced, list):
        raise ValueError("files is not a list")
    seen: set[str] = set()
    for entry in announced:
        if not (isinstance(entry, list) and len(entry) in (2, 3) and valid_name(entry[0]) and entry[0] not in seen
                and type(entry[1]) is int and entry[1] >= 0):  # fmt: skip
            raise ValueError("malformed input file announcement")
        seen.add(entry[0])
        if len(entry) == 3:
            received.append((entry[0], _passed_file(entry, passed, handoff)))
            continue
        staged = entry[1] >= SENT_FROM_FILE_BYTES
        if entry[1] > budgets[staged]:
            raise ValueError("malformed input file announcement")
        if staged:
            received.append((entry[0], _stage(src, entry[0], entry[1], len(received))))
            budgets[staged] -= entry[1]
            continue
        body = read_bytes_frame(src, budgets[0])
        if len(body) != entry[1]:
            raise ValueError(f"input file {entry[0]!r} is {len(body)} bytes, announced {entry[1]}")
        received.append((entry[0], body))
        budgets[0] -= entry[1]


def _stage(src: int | Channel, name: str, size: int, index: int) -> StagedFile:
    """Input file ``name``'s frame of exactly ``size`` bytes, written onto the disk as it comes through the
    runner's one reused buffer: never a 10 MB object in this process, never a copy of it. A disk too small
    for it still takes the whole frame off the channel, then PassedTextError says so (the run is refused)."""
    (length,) = HEADER.unpack(read_exact(src, HEADER.size))
    if length != size:
        raise ValueError(f"input file {name!r} is {length} bytes, announced {size}")
    staged = StagedFile(_STAGING + str(index), size)
    fd = os.open(staged.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _ANY, 0o400)
    view = memoryview(copy_buffer())
    failed: OSError | None = None
    try:
        while size:
            chunk = view[: min(size, len(view))]
            got = src.readinto(chunk) if isinstance(src, Channel) else os.readv(src, [chunk])
            if not got:
                raise EOFError("channel closed")
            if failed is None:
                try:
                    write_all(fd, chunk[:got])
                except OSError as exc:  # the disk is full: read the rest of the frame, then refuse the run
                    failed = exc
            size -= got
    except BaseException:
        staged.close()
        raise
    finally:
        os.close(fd)
    if failed is not None:
        staged.close()
        raise PassedTextError(f"the input files do not fit the sandbox's disk: {failed.strerror}")
    return staged


def _passed_file(entry: list[Any], passed: dict[int, int], handoff: str | None) -> FileBody:
    """Input file ``[name, length, i]``: the sealed memfd passed as descriptor ``i`` (taken out of ``passed``),
    or the hand-off directory's file ``i``, checked to hold exactly ``length`` bytes."""
    name, size, index = entry
    if type(index) is not int or not 0 <= index < MAX_PASSED_FDS or (handoff is None and index not in passed):
        raise PassedTextError(f"input file {name!r} names descriptor {index!r}, which was not passed")
    body = FileBody(passed.pop(index) if handoff is None else open_handed_off(handoff, index), size)
    try:
        check_passed(body.fd, size, sealed=handoff is None, what=f"input file {name!r}")
    except BaseException:
        body.close()
        raise
    return body


def release(files: list[tuple[str, Body]]) -> None:
    """Close what holds files' bytes in files (a run that ends before they are used or sent), and remove
    the staged inputs the file area did not take."""
    for _, body in files:
        if isinstance(body, FileBody | StagedFile):
            body.close()


class FileArea:
    """``inputs/`` and ``outputs/`` under the working directory: made (and the inputs written, 0400) before
    the tripwire is armed, so the program's events are only its opens and the collector's. Read-only is the
    program's ``open`` and the tripwire's rule (a program cannot ``chmod``); the directory stays 0700 so the
    host can remove a work directory that lives on its own disk (the subprocess backend without namespaces)."""

    def __init__(self, inputs: list[tuple[str, Body]]) -> None:
        cwd = os.getcwd()
        self.root = "" if cwd == "/" else cwd
        self.inputs = self.root + "/" + INPUTS_DIR
        self.outputs = self.root + "/" + OUTPUTS_DIR
        os.mkdir(self.inputs, 0o700)
        os.mkdir(self.outputs, 0o700)
        try:
            for name, body in inputs:
                if isinstance(body, StagedFile):  # on this disk already (0400): renamed, not copied
                    os.rename(body.path, self.inputs + "/" + name)
                    body.path = ""
                    continue
                fd = os.open(self.inputs + "/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _ANY, 0o400)
                try:
                    if isinstance(body, FileBody):
                        send_file(fd, body)  # the kernel copies the memfd's pages onto this disk
                        continue
                    view = memoryview(body)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
        finally:
            release(inputs)  # the memfds are closed before any program runs

    def open(
        self, file: object, mode: str = "r", buffering: int = -1, encoding: str | None = None,
        errors: str | None = None, newline: str | None = None,
    ) -> Any:  # fmt: skip
        """The program's ``open``: ``inputs/NAME`` for reading, ``outputs/NAME`` in any mode; text is UTF-8
        unless ``encoding`` says otherwise. Anything else is a PermissionError naming what is allowed."""
        if type(file) is not str or type(mode) is not str or not set(mode) <= _MODE_CHARS:
            raise PermissionError("open() takes a path as text ('inputs/NAME' or 'outputs/NAME') and a mode")
        folder, _, name = file.removeprefix("./").partition("/")
        if folder not in (INPUTS_DIR, OUTPUTS_DIR) or not valid_name(name):
            raise PermissionError(
                f"a program may open only 'inputs/NAME' (read) and 'outputs/NAME' (write), NAME matching "
                f"{FILE_NAME_PATTERN}, not {file[:200]!r}"
            )
        if folder == INPUTS_DIR and mode not in _READ_MODES:
            raise PermissionError(f"input files are read-only: open {file[:200]!r} with mode 'r' or 'rb'")
        if "b" not in mode and encoding is None:
            encoding = "utf-8"
        path = (self.inputs if folder == INPUTS_DIR else self.outputs) + "/" + name
        return open(path, mode, buffering, encoding, errors, newline, opener=_opener)

    def collect(self, limits: dict[str, Any]) -> tuple[list[tuple[str, Body]], dict[str, Any] | None]:
        """The files in ``outputs/``, in name order, or the error that fails the run: ``output_limit`` past a
        bound, ``sandbox_violation`` for anything but a regular file with one link and a valid name. A large
        file stays in its file (a ``FileBody`` of the descriptor checked here, its size taken then), up to a
        few within the open-files limit; the others are read."""
        collected: list[tuple[str, Body]] = []
        error = self._collect(limits, collected)
        if error is not None:
            release(collected)
            return [], error
        return collected, None

    def _collect(self, limits: dict[str, Any], collected: list[tuple[str, Body]]) -> dict[str, Any] | None:
        count, each, total = int(limits["max_files"]), int(limits["max_file_bytes"]), int(limits["max_files_bytes"])
        kept = min(MAX_PASSED_FDS, max(0, (int(limits.get("max_open_files", 16)) - 16) // 2))
        with os.scandir(self.outputs) as entries:
            names = sorted(entry.name for entry in entries)
        if len(names) > count:
            return _error("output_limit", f"the program wrote {len(names)} output files; the limit is {count}")
        left = total
        for name in names:
            if not valid_name(name):
                return _violation(f"an output file has a name outside {FILE_NAME_PATTERN}")
            try:
                fd = os.open(self.outputs + "/" + name, os.O_RDONLY | _ANY)
            except OSError as exc:
                return _violation(f"output {name!r} could not be opened as a file ({exc.strerror})")
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                    return _violation(f"output {name!r} is not a regular file with one link")
                if kept and SENT_FROM_FILE_BYTES <= info.st_size <= min(each, left):
                    body: Body = FileBody(fd, info.st_size)  # exactly these bytes are sent, from this descriptor
                    fd, kept = -1, kept - 1
                else:
                    body = _read_bounded(fd, min(each, left) + 1)
            finally:
                if fd >= 0:
                    os.close(fd)
            collected.append((name, body))
            if len(body) > each:
                return _error("output_limit", f"output {name!r} is larger than the {each}-byte limit per file")
            if len(body) > left:
                return _error("output_limit", f"the output files are larger than the {total}-byte limit in all")
            left -= len(body)
        return None


def prepare(inputs: list[tuple[str, Body]] | None) -> tuple[FileArea | None, dict[str, Any] | None]:
    """The file area of a served execution (``inputs`` a list, maybe empty; None: no area, the tests' direct
    calls of ``serving.execute``), or the error that ends the run before it starts."""
    if inputs is None:
        return None, None
    try:
        return FileArea(inputs), None
    except OSError as exc:
        return None, _error("invalid_request", f"the input files do not fit the sandbox's disk: {exc.strerror}")


def expose(namespace: dict[str, Any], area: FileArea | None) -> None:
    """Give the program its ``open`` and the errors it raises, to catch (a namespace whose builtins are a
    module or the interpreter's own, an escaped test runner's, keeps the real ones)."""
    table = namespace.get("__builtins__")
    if area is not None and isinstance(table, dict) and table is not vars(builtins):
        table["open"] = area.open
        for error in _OS_ERRORS:
            table.setdefault(error.__name__, error)


def collect(area: FileArea | None, limits: dict[str, Any]) -> tuple[list[tuple[str, Body]], dict[str, Any] | None]:
    return area.collect(limits) if area is not None else ([], None)


def _opener(path: str, flags: int) -> int:
    """``os.open`` that never follows a link or blocks on a FIFO, and refuses anything but a regular file."""
    fd = os.open(path, flags | _ANY, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(f"{os.path.basename(path)!r} is not a regular file")
    return fd


def _read_bounded(fd: int, most: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < most and (chunk := os.read(fd, min(most - got, 1 << 20))):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _violation(message: str) -> dict[str, Any]:
    event = {"source": "inner_wall", "event": "output_file", "detail": message[:200]}
    return _error("sandbox_violation", message, security_event=event)
