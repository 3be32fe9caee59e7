"""Request bodies received as they arrive (issue 41): the files of an upload (``POST /v1/files``) or of a
multipart ``POST /v1/exec`` go chunk by chunk into spools (:mod:`.spool`), never whole into memory.

A body is a multipart form (each file part named by its filename; other fields kept, bounded) or one raw
``application/octet-stream`` body named by the caller. Every bound is checked before a chunk is written:
the count of files, each file (the spool's own ``limit``), the files in all, and each field. The first
chunk past one raises :class:`~.spool.TooLarge` and nothing more is read; whatever was received is then
discarded, as it is when the client goes away (the gate's :class:`~.gate.ClientGone`) or the form is bad.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header

from sandforge.runtime.errors import InputFileError
from sandforge.runtime.files.transfer import check_name
from sandforge.runtime.service.deps import ApiError
from sandforge.runtime.service.spool import Spool, TooLarge, TooMany

#: content types a streamed body may have
FORM, RAW = "multipart/form-data", "application/octet-stream"


@dataclass
class Bounds:
    """What a streamed body may hold: files (count, in all; each file's bound is its spool's) and fields."""

    max_files: int
    files_bytes: int
    field_bytes: int
    max_fields: int = 16


@dataclass
class Received:
    """The files and fields of one body; :meth:`discard` removes every file not yet stored."""

    files: list[Spool] = field(default_factory=list)
    fields: dict[str, bytes] = field(default_factory=dict)

    def discard(self) -> None:
        for spool in self.files:
            spool.discard()


def content_kind(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def file_name(name: str) -> str:
    try:
        return check_name(name, "file name")
    except InputFileError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


class _Form:
    """python-multipart's callbacks: each part's headers, then its data into a spool or a bounded field."""

    def __init__(self, into: Received, new_file: Callable[[str], Spool], bounds: Bounds) -> None:
        self.into, self.new_file, self.bounds = into, new_file, bounds
        self.header: tuple[bytearray, bytearray] = (bytearray(), bytearray())
        self.headers: dict[bytes, bytes] = {}
        self.spool: Spool | None = None
        self.field: bytearray | None = None
        self.field_name = ""
        self.files_bytes = 0
        self.ended = False

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {"on_part_begin": self.headers.clear, "on_header_field": self.on_header_field,
                "on_header_value": self.on_header_value, "on_header_end": self.on_header_end,
                "on_headers_finished": self.on_headers_finished, "on_part_data": self.on_part_data,
                "on_part_end": self.on_part_end, "on_end": self.on_end}  # fmt: skip

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header[0].extend(data[start:end])

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header[1].extend(data[start:end])

    def on_header_end(self) -> None:
        self.headers[bytes(self.header[0]).lower()] = bytes(self.header[1])
        self.header[0].clear()
        self.header[1].clear()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        filename = options.get(b"filename")
        if filename is not None:
            if len(self.into.files) >= self.bounds.max_files:
                raise TooMany(f"more than {self.bounds.max_files} files")
            name = file_name(filename.decode("utf-8", "replace"))
            self.spool = self.new_file(name)
            self.into.files.append(self.spool)
            return
        if len(self.into.fields) >= self.bounds.max_fields:
            raise TooLarge(f"more than {self.bounds.max_fields} form fields")
        self.field = bytearray()
        self.field_name = options.get(b"name", b"").decode("utf-8", "replace")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = memoryview(data)[start:end]
        if self.spool is not None:
            self.files_bytes += len(chunk)
            if self.files_bytes > self.bounds.files_bytes:
                raise TooLarge(f"the files are over the limit of {self.bounds.files_bytes} bytes in all")
            self.spool.write(chunk)
        elif self.field is not None:
            if len(self.field) + len(chunk) > self.bounds.field_bytes:
                raise TooLarge(f"a form field is over the limit of {self.bounds.field_bytes} bytes")
            self.field.extend(chunk)

    def on_part_end(self) -> None:
        if self.spool is not None:
            self.spool.finish()
        if self.field is not None:
            self.into.fields[self.field_name] = bytes(self.field)
        self.spool, self.field = None, None

    def on_end(self) -> None:
        self.ended = True


async def receive_body(
    content_type: str, raw_name: str | None, chunks: AsyncIterator[bytes], new_file: Callable[[str], Spool],
    bounds: Bounds,
) -> Received:  # fmt: skip
    """The files (spooled) and fields of a streamed body; ApiError 422 for a body that is not one, TooLarge
    past a bound. On any failure every spooled file is discarded."""
    kind = content_kind(content_type)
    received = Received()
    try:
        if kind == RAW:
            if raw_name is None:
                raise ApiError(422, "invalid_request", "a raw upload needs ?name=FILE_NAME")
            spool = new_file(file_name(raw_name))
            received.files.append(spool)
            async for chunk in chunks:
                spool.write(chunk)
            spool.finish()
            return received
        if kind != FORM:
            raise ApiError(422, "invalid_request", "body: send multipart/form-data, or application/octet-stream "
                                                   "with ?name=")  # fmt: skip
        await _receive_form(content_type, chunks, _Form(received, new_file, bounds))
        return received
    except BaseException:
        received.discard()
        raise


async def _receive_form(content_type: str, chunks: AsyncIterator[bytes], form: _Form) -> None:
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        raise ApiError(422, "invalid_request", "body: not a multipart form (no boundary)")
    try:
        parser = MultipartParser(boundary, form.callbacks())  # type: ignore[arg-type]
        async for chunk in chunks:
            parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise ApiError(422, "invalid_request", f"body: not a multipart form ({exc})") from None
    if not form.ended:
        raise ApiError(422, "invalid_request", "body: not a multipart form (it ends before its last boundary)")
