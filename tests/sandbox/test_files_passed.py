"""Large files cross without being copied through the channel (issue 41's benchmark): an input file of 64 KiB
or more travels as a sealed memfd (runc, and subprocess with ``STREAMS_INPUTS`` off: ``memfd_inputs``; by
default subprocess streams it, ``test_files_streamed.py``) or a hand-off file (docker, gvisor, runsc), which the
runner copies onto its disk before the program runs; a large output is sent from the file the collector
checked, exactly the size it announced. Every guarantee of the frames they replace holds, and each test here
fails on a deliberately broken variant: an unsealed memfd, a memfd left open for the program, an output
sent past its announced size, a result frame of another length than announced.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import re
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox import exchange as exchange_module
from sandforge.sandbox.backends import subprocess_backend
from sandforge.sandbox.channel import WorkerIO
from sandforge.sandbox.context import SEALED_MIN_BYTES
from sandforge.sandbox.exchange import run_exchange
from sandforge.sandbox.inside import channel as inside_channel
from sandforge.sandbox.inside import files as inside_files
from sandforge.sandbox.protocol import HEADER
from tests.sandbox.test_context_memfd import HANDS_OFF, PASSES_FDS, Traffic, memfd
from tests.sandbox.test_context_protocol import ScriptedIO, frame, result
from tests.sandbox.test_os_boundary import escaped

BIG = os.urandom(3 * SEALED_MIN_BYTES) + b"end"
OTHER = bytes(range(256)) * (SEALED_MIN_BYTES // 256 + 1)

COPY = """
with open("inputs/big.bin", "rb") as src, open("outputs/copy.bin", "wb") as dst:
    while chunk := src.read(50000):
        dst.write(chunk)
with open("outputs/note.txt", "w") as f:
    f.write(open("inputs/small.csv").read().upper() + open("inputs/empty.txt").read())
return len(open("inputs/big.bin", "rb").read())
"""


def test_large_inputs_are_passed_and_outputs_come_back_on_every_backend(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large input reaches the program byte for byte without crossing the channel; small ones still go as
    frames; a large output comes back whole."""
    from sandforge.sandbox.handoff import HandoffDir

    traffic = Traffic(monkeypatch)
    put_bytes, handed = HandoffDir.put_bytes, []

    def spy_put_bytes(self: HandoffDir, index: int, data: bytes) -> None:
        handed.append(len(data))
        put_bytes(self, index, data)

    monkeypatch.setattr(HandoffDir, "put_bytes", spy_put_bytes)
    files = {"big.bin": BIG, "small.csv": b"a,b\n", "empty.txt": b""}
    out = sandbox.execute(ExecutionRequest(code=COPY, files=files))
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.value == len(BIG)
    assert out.files == {"copy.bin": BIG, "note.txt": b"A,B\n"}
    streams = sandbox.config.backend == "subprocess"  # onto its disk as the frame comes (STREAMS_INPUTS)
    assert traffic.passed == ([1] if sandbox.config.backend in PASSES_FDS and not streams else [])
    assert handed == ([len(BIG)] if sandbox.config.backend in HANDS_OFF else [])
    if streams:
        assert len(BIG) < traffic.bytes < len(BIG) + SEALED_MIN_BYTES
    else:
        assert traffic.bytes < SEALED_MIN_BYTES  # the frames, the small files: never the large one


@pytest.fixture
def memfd_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess backend passing large inputs as sealed memfds, as runc does (not streaming them)."""
    monkeypatch.setattr(subprocess_backend, "STREAMS_INPUTS", False)


@pytest.mark.usefixtures("memfd_inputs")
def test_input_files_take_the_descriptors_the_context_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two descriptors to give (a small open-files limit), the context's large value takes one, the
    largest input the other; the rest travel as frames, and all arrive intact."""
    traffic = Traffic(monkeypatch)
    limits = Limits(max_open_files=20)  # fd_budget: 2
    files = {"big.bin": BIG, "other.bin": OTHER, "third.bin": OTHER[:-1]}
    code = "return [len(context['v'])] + [len(open('inputs/' + n, 'rb').read()) for n in sorted(NAMES)]"
    code = code.replace("NAMES", repr(list(files)))
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code=code, context={"v": "x" * SEALED_MIN_BYTES}, files=files, limits=limits))
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == [SEALED_MIN_BYTES, len(BIG), len(OTHER), len(OTHER) - 1]
    assert traffic.passed == [2]
    assert traffic.bytes >= 2 * len(OTHER) - 1  # the two smaller inputs, as frames


# --- the input's memfd -----------------------------------------------------------------------------------


class _PassingIO(WorkerIO):
    passes_fds = True

    def send(self, data: bytes, deadline: float | None = None) -> None:
        raise AssertionError("not sent")

    def poll(self, timeout: float) -> list[Any]:
        return []


def test_a_passed_input_cannot_be_changed_through_its_memfd() -> None:
    """What the host passes for an input is sealed: whoever holds the descriptor (the runner, or a program
    that found it) can neither write, resize nor map it writable, nor lift the seals."""
    fds: list[int] = []
    request = ExecutionRequest(code="return 1", files={"big.bin": BIG})
    sent, held = exchange_module._pass_files(_PassingIO(), request, 0, 16, fds)
    assert sent == {"big.bin": 0} and len(fds) == 1 and held[0].fd == fds[0]
    fd = fds[0]
    for attempt in (
        lambda: os.write(fd, b"HACK"),
        lambda: os.pwrite(fd, b"HACK", 0),
        lambda: os.ftruncate(fd, 1),
        lambda: os.ftruncate(fd, len(BIG) + 1),
        lambda: mmap.mmap(fd, 4, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE),
        lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0),
    ):
        with pytest.raises(PermissionError):
            attempt()
    assert os.pread(fd, len(BIG) + 1, 0) == BIG


@pytest.mark.usefixtures("memfd_inputs")
def test_an_unsealed_input_memfd_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host side that passes an input's memfd unsealed gets invalid_request; the program never runs."""
    made: list[int] = []

    def unsealed(text: bytes, name: str) -> SimpleNamespace:
        made.append(memfd(text, 0))
        return SimpleNamespace(fd=made[-1], size=len(text))

    monkeypatch.setattr(exchange_module, "SealedText", unsealed)
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return 1", files={"big.bin": BIG}))
    for fd in made:
        os.close(fd)
    assert out.error_type == ErrorType.INVALID_REQUEST and "not sealed" in (out.error_message or ""), out


FIND_MEMFDS = """
import fcntl, os
found = []
for fd in range(1024):
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        continue
    found.append([fd, os.fstat(fd).st_size])
info = os.stat("inputs/big.bin")
return [found, oct(info.st_mode & 0o777), info.st_size]
"""


@pytest.mark.usefixtures("memfd_inputs")
def test_an_escaped_program_finds_no_input_memfd() -> None:
    """The runner copies each passed input onto its disk and closes the memfd before the program runs: a
    program that escaped everything finds no descriptor of the host's (read-only there as in inputs/)."""
    out = escaped(FIND_MEMFDS, files={"big.bin": BIG})
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    found, mode, size = out.value
    assert found == [] and mode == "0o400" and size == len(BIG)


# --- the runner's checks of what the execute frame announces --------------------------------------------


def _receive(files: list[Any], fds: list[int], *frames: bytes, later_fds: list[int] | None = None) -> Any:
    """What the runner's ``read_execute`` and ``files.receive`` make of a forged execute frame; the error
    otherwise."""
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    body = json.dumps({"type": "execute", "code": "return 1", "args": [], "kwargs": {}, "context_keys": [],
                       "files": files}).encode()  # fmt: skip
    socket.send_fds(host, [HEADER.pack(len(body)) + body], fds) if fds else host.sendall(HEADER.pack(len(body)) + body)
    for i, text in enumerate(frames):
        data = HEADER.pack(len(text)) + text
        socket.send_fds(host, [data], later_fds) if later_fds and i == 0 else host.sendall(data)
    host.close()
    channel = inside_channel.Channel(sandbox.detach())
    try:
        passed: dict[int, int] = {}
        frame_, _ = inside_channel.read_execute(channel, 1 << 20, None, passed)
        received = inside_files.receive(channel, frame_, 1 << 20, passed)
        return [(name, body if isinstance(body, bytes) else os.pread(body.fd, body.size + 1, 0))
                for name, body in received]  # fmt: skip
    except ValueError as exc:
        return exc
    finally:
        assert channel.sock is not None
        channel.sock.close()


def test_the_runner_takes_an_announced_input_memfd() -> None:
    fd = memfd(b"0123456789")
    try:
        got = _receive([["a.bin", 10, 0], ["b.txt", 1]], [fd], b"b")
    finally:
        os.close(fd)
    assert got == [("a.bin", b"0123456789"), ("b.txt", b"b")]


@pytest.mark.parametrize(
    ("files", "sealed", "nfds", "later", "needle"),
    [
        ([["a.bin", 10, 0]], False, 1, 0, "not sealed"),  # an unsealed memfd
        ([["a.bin", 9, 0]], True, 1, 0, "holds 10 bytes, announced 9"),  # a size other than announced
        ([["a.bin", 11, 0]], True, 1, 0, "holds 10 bytes, announced 11"),
        ([["a.bin", 10, 1]], True, 1, 0, "which was not passed|not announced"),  # an index beyond those passed
        ([["a.bin", 10, 0], ["b.bin", 10, 0]], True, 1, 0, "which was not passed"),  # one descriptor twice
        ([["a.bin", 10]], True, 1, 0, "not announced"),  # a descriptor no file claims
        ([["a.bin", 10, True]], True, 1, 0, "which was not passed|not announced"),
        ([["a.bin", 1]], True, 0, 1, "with an input file's frame"),  # attached to a file's frame
    ],
)
def test_the_runner_refuses_input_descriptors_that_do_not_match(
    files: list[Any], sealed: bool, nfds: int, later: int, needle: str
) -> None:
    fds = [memfd(b"0123456789", inside_channel.REQUIRED_SEALS if sealed else 0) for _ in range(max(nfds, later))]
    before = set(os.listdir("/proc/self/fd"))
    frames = [b"x"] if any(len(f) == 2 and f[1] == 1 for f in files) else []
    got = _receive(files, fds[:nfds], *frames, later_fds=fds[:later] or None)
    for fd in fds:
        os.close(fd)
    assert isinstance(got, inside_channel.PassedTextError), got
    assert re.search(needle, str(got)), got
    assert set(os.listdir("/proc/self/fd")) <= before  # every descriptor received was closed


# --- an output sent from its file --------------------------------------------------------------------------


def test_an_output_is_sent_from_its_file_exactly_as_announced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector keeps a large output's checked descriptor and its size then; the frame carries exactly
    that many bytes even if the file grows afterwards (a racing thread of an escaped program), and a file
    that shrank cannot complete its frame (the runner fails: the host sees an incomplete result)."""
    monkeypatch.chdir(tmp_path)
    area = inside_files.FileArea([])
    (tmp_path / "outputs" / "big.bin").write_bytes(BIG)
    (tmp_path / "outputs" / "small.txt").write_bytes(b"ok")
    limits = Limits().model_dump()
    collected, error = area.collect(limits)
    assert error is None and [name for name, _ in collected] == ["big.bin", "small.txt"]
    body = collected[0][1]
    assert isinstance(body, inside_channel.FileBody) and len(body) == len(BIG)
    with open(tmp_path / "outputs" / "big.bin", "ab") as grow:
        grow.write(b"MORE")
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, 1031, 1 << 20)  # F_SETPIPE_SZ: the whole frame fits
        inside_channel.write_frames(write_end, [b"{}", body])
        os.close(write_end)
        sent = b""
        while chunk := os.read(read_end, 1 << 20):
            sent += chunk
    finally:
        os.close(read_end)
    assert sent == HEADER.pack(2) + b"{}" + HEADER.pack(len(BIG)) + BIG  # not a byte of MORE
    os.truncate(tmp_path / "outputs" / "big.bin", 10)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 1 << 20)
    try:
        with pytest.raises(OSError, match="ended before its announced length"):
            inside_channel.write_frames(write_end, [body])
    finally:
        os.close(read_end)
        os.close(write_end)
        inside_files.release(collected)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("fewer bytes than announced", frame(result(files=[["o.bin", 10]])) + frame(b"123456789")),
        ("more bytes than announced", frame(result(files=[["o.bin", 10]])) + frame(b"0123456789A")),
        ("bytes after the last file", frame(result(files=[["o.bin", 2]])) + frame(b"ab") + frame(b"cd")),
        ("a file's frame missing", frame(result(files=[["o.bin", 2], ["p.bin", 2]])) + frame(b"ab")),
        ("past the bound per file", frame(result(files=[["o.bin", 2000]])) + frame(b"x" * 2000)),
    ],
)
def test_a_result_whose_output_frames_differ_from_its_announcement_commits_nothing(name: str, data: bytes) -> None:
    """The host checks every output frame against the announcement it already checked against the bounds:
    a runner (or a program that owns the channel) sending another length, more frames, or fewer, gets a
    violation and no file."""
    limits = Limits(max_file_bytes=1024, max_message_bytes=1 << 20)
    ex = run_exchange(ScriptedIO(data), ExecutionRequest(code="return 1", limits=limits), None)
    assert ex.failure is not None and ex.failure[0] == ErrorType.SANDBOX_VIOLATION, (name, ex.failure)
    assert ex.context is None
