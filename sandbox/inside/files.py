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

# ruff: noqa: PTH102, PTH109, PTH119 - the runner avoids pathlib (import cost)

from __future__ import annotations

import builtins
import os
import re
import stat
from typing import Any

from .channel import Channel, read_bytes_frame
from .wire import FILE_NAME_PATTERN, INPUTS_DIR, OUTPUTS_DIR
from .wire import error as _error

_NAME = re.compile(FILE_NAME_PATTERN)
_READ_MODES = frozenset({"r", "rt", "rb", "tr", "br"})
_MODE_CHARS = frozenset("rwaxbt+")
_ANY = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: What the program's ``open`` and its files raise.
_OS_ERRORS = (OSError, FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, UnicodeDecodeError)


def valid_name(name: object) -> bool:
    return type(name) is str and _NAME.fullmatch(name) is not None


def receive(src: int | Channel, frame: dict[str, Any], budget: int) -> list[tuple[str, bytes]]:
    """The input files announced by the execute frame (``[name, length]``), each read as the frame after the
    context texts; ValueError for a malformed announcement or a file of another length."""
    announced = frame.get("files", [])
    if not isinstance(announced, list):
        raise ValueError("files is not a list")
    received: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for entry in announced:
        if not (isinstance(entry, list) and len(entry) == 2 and valid_name(entry[0]) and entry[0] not in seen
                and type(entry[1]) is int and 0 <= entry[1] <= budget):  # fmt: skip
            raise ValueError("malformed input file announcement")
        body = read_bytes_frame(src, budget)
        if len(body) != entry[1]:
            raise ValueError(f"input file {entry[0]!r} is {len(body)} bytes, announced {entry[1]}")
        seen.add(entry[0])
        received.append((entry[0], body))
        budget -= entry[1]
    return received


class FileArea:
    """``inputs/`` and ``outputs/`` under the working directory: made (and the inputs written, 0400) before
    the tripwire is armed, so the program's events are only its opens and the collector's. Read-only is the
    program's ``open`` and the tripwire's rule (a program cannot ``chmod``); the directory stays 0700 so the
    host can remove a work directory that lives on its own disk (the subprocess backend without namespaces)."""

    def __init__(self, inputs: list[tuple[str, bytes]]) -> None:
        cwd = os.getcwd()
        self.root = "" if cwd == "/" else cwd
        self.inputs = self.root + "/" + INPUTS_DIR
        self.outputs = self.root + "/" + OUTPUTS_DIR
        os.mkdir(self.inputs, 0o700)
        os.mkdir(self.outputs, 0o700)
        for name, body in inputs:
            fd = os.open(self.inputs + "/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _ANY, 0o400)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)

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

    def collect(self, limits: dict[str, Any]) -> tuple[list[tuple[str, bytes]], dict[str, Any] | None]:
        """The files in ``outputs/``, in name order, or the error that fails the run: ``output_limit`` past a
        bound, ``sandbox_violation`` for anything but a regular file with one link and a valid name."""
        count, each, total = int(limits["max_files"]), int(limits["max_file_bytes"]), int(limits["max_files_bytes"])
        with os.scandir(self.outputs) as entries:
            names = sorted(entry.name for entry in entries)
        if len(names) > count:
            return [], _error("output_limit", f"the program wrote {len(names)} output files; the limit is {count}")
        collected: list[tuple[str, bytes]] = []
        left = total
        for name in names:
            if not valid_name(name):
                return [], _violation(f"an output file has a name outside {FILE_NAME_PATTERN}")
            try:
                fd = os.open(self.outputs + "/" + name, os.O_RDONLY | _ANY)
            except OSError as exc:
                return [], _violation(f"output {name!r} could not be opened as a file ({exc.strerror})")
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                    return [], _violation(f"output {name!r} is not a regular file with one link")
                body = _read_bounded(fd, min(each, left) + 1)
            finally:
                os.close(fd)
            if len(body) > each:
                return [], _error("output_limit", f"output {name!r} is larger than the {each}-byte limit per file")
            if len(body) > left:
                return [], _error("output_limit", f"the output files are larger than the {total}-byte limit in all")
            left -= len(body)
            collected.append((name, body))
        return collected, None


def prepare(inputs: list[tuple[str, bytes]] | None) -> tuple[FileArea | None, dict[str, Any] | None]:
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


def collect(area: FileArea | None, limits: dict[str, Any]) -> tuple[list[tuple[str, bytes]], dict[str, Any] | None]:
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
