"""The broker's response header parsing (runtime/egress/transport.py: ``read_fields``, ``PinnedResponse``): the
standard library's framing decisions (chunked, length, closing) on the same bytes, within the same bounds,
without its e-mail parser; stricter where that parser let a malformed line pass as the start of a body."""

from __future__ import annotations

import http.client
import io

import pytest

from sandforge.runtime.egress import transport
from sandforge.runtime.egress.transport import PinnedResponse, _Headers, read_fields


class _Sock:
    """What ``HTTPResponse`` needs of a socket: ``makefile``."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.raw))  # type: ignore[arg-type]


def fields(head: bytes) -> list[tuple[str, str]]:
    return read_fields(io.BytesIO(head))


def test_fields_keep_their_order_names_and_values() -> None:
    got = fields(b"Content-Type: text/plain\r\nX-Two:  spaced \r\nx-two: again\r\n\r\nbody")
    assert got == [("Content-Type", "text/plain"), ("X-Two", "spaced "), ("x-two", "again")]
    headers = _Headers(got)
    assert headers.get("x-TWO") == "spaced " and headers.get_all("X-Two") == ["spaced ", "again"]
    assert headers.get("missing") is None and headers.get_all("missing") is None


def test_a_folded_line_is_unfolded_with_a_space_never_a_line_break() -> None:
    got = fields(b"X-Long: one\r\n\ttwo\r\n  three\r\n\r\n")
    assert got == [("X-Long", "one two three")]
    assert all("\r" not in value and "\n" not in value for _, value in got)


@pytest.mark.parametrize(
    "head",
    [
        b"no colon here\r\n\r\n",
        b"Content-Length : 5\r\n\r\n",  # whitespace before the colon: refused (RFC 9112 5.1), never read as a body
        b": empty name\r\n\r\n",
        b" folded first\r\n\r\n",
        b"Bad\x01Name: x\r\n\r\n",
    ],
)
def test_a_malformed_line_is_a_protocol_error(head: bytes) -> None:
    with pytest.raises(http.client.HTTPException):
        fields(head)


def test_the_standard_librarys_bounds_hold() -> None:
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        fields(b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n")
    assert len(fields(b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n")) == 100
    with pytest.raises(http.client.LineTooLong):
        fields(b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n")


RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\nuntil close",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\n\r\nno length: read until close",
    b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\nnegative",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nnot a number",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
    b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
]


@pytest.mark.parametrize("raw", RESPONSES)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_framing_is_the_standard_librarys(raw: bytes, method: str) -> None:
    """The same bytes give the same decisions and the same body as ``http.client.HTTPResponse``."""
    ours, theirs = PinnedResponse(_Sock(raw), method=method), http.client.HTTPResponse(_Sock(raw), method=method)  # type: ignore[arg-type]
    ours.begin()
    theirs.begin()
    decided = ("status", "reason", "version", "chunked", "length", "will_close")
    assert {name: getattr(ours, name) for name in decided} == {name: getattr(theirs, name) for name in decided}
    assert ours.getheaders() == theirs.getheaders()
    assert ours.getheader("content-length") == theirs.getheader("content-length")
    assert ours.read() == theirs.read()
    assert ours.isclosed() == theirs.isclosed()


def test_the_pinned_connection_uses_it() -> None:
    assert transport._PinnedConnection.response_class is PinnedResponse
