"""Large input files streamed onto the disk (issue 41's benchmark): on the subprocess backend an input of
64 KiB or more goes as a frame that the runner writes onto its huge-page tmpfs as it comes, through its one
reused buffer (``files.StagedFile``), then renames into ``inputs/``: no memfd to fill a small page at a time,
no 10 MB object in the runner. The files' limits bound such a frame, not the message's; its length is checked
as every frame's is; a disk too small refuses the run; nothing staged is left behind, whatever happens.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.inside import channel as inside_channel
from sandforge.sandbox.inside import files as inside_files
from sandforge.sandbox.protocol import HEADER
from tests.sandbox.test_context_memfd import Traffic
from tests.sandbox.test_os_boundary import escaped

BIG = os.urandom(1 << 20) + b"end"

LOOK = """
import hashlib, os
info = os.stat("inputs/big.bin")
digest = hashlib.sha256(open("inputs/big.bin", "rb").read()).hexdigest()
return [sorted(os.listdir(".")), oct(info.st_mode & 0o777), digest]
"""


def test_a_large_input_is_written_onto_the_disk_as_it_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """It crosses the channel once, lands read-only in ``inputs/`` byte for byte, and no staged name is left
    beside it for the program (one that escaped everything lists the working directory)."""
    traffic = Traffic(monkeypatch)
    out = escaped(LOOK, files={"big.bin": BIG})
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    listed, mode, digest = out.value
    assert set(listed) <= {"inputs", "outputs", "usr"}, listed
    assert mode == "0o400" and digest == hashlib.sha256(BIG).hexdigest()
    assert traffic.passed == [] and len(BIG) < traffic.bytes < len(BIG) + (1 << 16)


def test_a_large_input_counts_against_the_files_limits_not_the_messages() -> None:
    """A 1 MB input with a 64 KiB message limit: the frame goes to the disk, so only the files' bounds apply."""
    limits = Limits(max_message_bytes=1 << 16)
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return len(open('inputs/big.bin', 'rb').read())",
                                          files={"big.bin": BIG}, limits=limits))  # fmt: skip
    assert out.ok and out.value == len(BIG), (out.error_type, out.error_message)


def _stage(tmp_path: Path, announced: int, data: bytes, fds: list[int] | None = None) -> object:
    """What the runner's ``files.receive`` makes of an input announced as ``announced`` bytes, whose frame
    holds ``data`` (and carries ``fds``), then a small one, in ``tmp_path`` as its working directory."""
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    frame = json.dumps({"type": "execute", "files": [["big.bin", announced], ["small.txt", 2]]})
    payload = HEADER.pack(len(data)) + data + HEADER.pack(2) + b"ok"

    def send() -> None:  # beside the runner's reads: the frame is larger than the socket's buffer
        with host:
            if fds:
                socket.send_fds(host, [payload[:4]], fds)
            with contextlib.suppress(OSError):  # the runner stopped reading (a refused frame)
                host.sendall(payload[4:] if fds else payload)

    sender = threading.Thread(target=send)
    sender.start()
    channel = inside_channel.Channel(sandbox.detach())
    try:
        received = inside_files.receive(channel, json.loads(frame), 1 << 16, {}, None, 16 << 20)
    except ValueError as exc:
        return exc
    finally:
        assert channel.sock is not None
        channel.sock.close()  # the socket object owns the descriptor: closing it by number would close it twice
        sender.join()
    try:
        (name, body), small = received
        assert isinstance(body, inside_files.StagedFile) and small == ("small.txt", b"ok")
        return name, Path(body.path).read_bytes()
    finally:
        inside_files.release(received)


def test_the_runner_stages_exactly_the_announced_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _stage(tmp_path, len(BIG), BIG) == ("big.bin", BIG)
    assert list(tmp_path.iterdir()) == []  # released: the staged file is gone


@pytest.mark.parametrize(
    ("name", "announced", "data", "error"),
    [
        ("a frame shorter than announced", len(BIG), BIG[:-1], "bytes, announced"),
        ("a frame longer than announced", len(BIG) - 1, BIG, "bytes, announced"),
        ("past the files' budget", 17 << 20, b"x" * (17 << 20), "malformed"),
    ],
)
def test_the_runner_refuses_a_staged_frame_that_does_not_match(
    name: str, announced: int, data: bytes, error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    refused = _stage(tmp_path, announced, data)
    assert isinstance(refused, ValueError) and error in str(refused), (name, refused)
    assert list(tmp_path.iterdir()) == []


def test_a_disk_too_small_takes_the_frame_off_the_channel_and_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills mid-frame (ENOSPC): the rest of the frame is still read (the channel stays in step),
    nothing staged is left, and the run is refused as invalid_request (``serve`` turns PassedTextError so)."""
    monkeypatch.chdir(tmp_path)
    written: list[int] = []

    def fills(fd: int, data: memoryview) -> None:
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(len(data))
        os.write(fd, data)

    monkeypatch.setattr(inside_files, "write_all", fills)
    refused = _stage(tmp_path, len(BIG), BIG)
    assert isinstance(refused, inside_channel.PassedTextError), refused
    assert "do not fit the sandbox's disk" in str(refused)
    assert list(tmp_path.iterdir()) == []


def test_descriptors_with_a_staged_frame_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fd = os.memfd_create("extra")
    try:
        refused = _stage(tmp_path, len(BIG), BIG, [fd])
    finally:
        os.close(fd)
    assert isinstance(refused, inside_channel.PassedTextError), refused
    assert list(tmp_path.iterdir()) == []
