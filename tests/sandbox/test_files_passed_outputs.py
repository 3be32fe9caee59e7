"""Large output files come back as descriptors (issue 41's benchmark): on the subprocess backend the result
channel is a unix socket, and the runner attaches the descriptor its collector checked for each output of
64 KiB or more to the result frame (``files_passed``) instead of sending the bytes as frames. The host reads
each once (``read_passed_output``) after checking it as the runner did and more: a regular file with one link,
open read-only, exactly the announced size before and after the read, in memory (tmpfs). Anything else, one
descriptor more or fewer than announced, or one after the result, is a forged result: a violation, nothing
returned, every descriptor closed. Each test fails on a variant that drops the check it names.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox import exchange as exchange_module
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.channel import MAX_RECEIVED_FDS, SocketIO, result_channel
from sandforge.sandbox.exchange import run_exchange
from sandforge.sandbox.files import PassedOutputRefused, read_passed_output
from tests.sandbox.test_context_protocol import ScriptedIO, frame, result
from tests.sandbox.test_files_attacks import ESCAPED

BIG = os.urandom(200_000) + b"end"
TWO = ["a.bin", "big.bin"]
ERROR_RESULT = {"type": "result", "status": "error", "error": {"type": "execution", "message": "x"}}
SHM = Path("/dev/shm")


class PassingIO(ScriptedIO):
    """A scripted worker whose result channel carried ``fds`` with the result frame, and ``late`` after it."""

    def __init__(self, data: bytes, fds: list[int], late: list[int] | None = None) -> None:
        super().__init__(data)
        self.batches = [fds, late or []]

    def take_fds(self) -> tuple[list[int], bool]:
        return (self.batches.pop(0), False) if self.batches else ([], False)


@pytest.fixture
def shm_file(request: pytest.FixtureRequest) -> Iterator[Callable[[bytes], Path]]:
    """A file on tmpfs (``/dev/shm``), removed after the test."""
    made: list[Path] = []

    def make(data: bytes) -> Path:
        path = SHM / f"sandforge-test-{os.getpid()}-{len(made)}-{request.node.name[:40]}"
        path.write_bytes(data)
        made.append(path)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)


def _announced(size: int = len(BIG), passed: list[str] | None = None, **fields: Any) -> bytes:
    return frame(result(files=[["big.bin", size]], files_passed=["big.bin"] if passed is None else passed, **fields))


def _exchange(data: bytes, fds: list[int], late: list[int] | None = None) -> exchange_module.Exchange:
    limits = Limits(max_file_bytes=1 << 20, max_message_bytes=1 << 20)
    return run_exchange(PassingIO(data, fds, late), ExecutionRequest(code="return 1", limits=limits), None)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_the_checked_file_is_read_once_and_closed(shm_file: Callable[[bytes], Path]) -> None:
    fd = os.open(shm_file(BIG), os.O_RDONLY)
    ex = _exchange(_announced(), [fd])
    assert ex.failure is None and ex.files == {"big.bin": BIG}
    assert _closed(fd)


def _fifo(_: Callable[[bytes], Path], __: Path) -> int:
    read_end, write_end = os.pipe()
    os.close(write_end)
    return read_end


def _socket(_: Callable[[bytes], Path], __: Path) -> int:
    one, other = socket.socketpair()
    other.close()
    return one.detach()


def _on_disk(_: Callable[[bytes], Path], tmp_path: Path) -> int:
    path = tmp_path / "big.bin"  # the tests' temporary directory: on disk here, not tmpfs
    path.write_bytes(BIG)
    return os.open(path, os.O_RDONLY)


def _writable(make: Callable[[bytes], Path], _: Path) -> int:
    return os.open(make(BIG), os.O_RDWR)


def _hard_linked(make: Callable[[bytes], Path], _: Path) -> int:
    path, second = make(BIG), make(b"")
    second.unlink()
    os.link(path, second)  # the second name of the same file (removed with the others)
    return os.open(path, os.O_RDONLY)


def _unlinked(make: Callable[[bytes], Path], _: Path) -> int:
    path = make(BIG)
    fd = os.open(path, os.O_RDONLY)
    path.unlink()
    return fd


def _memfd(_: Callable[[bytes], Path], __: Path) -> int:
    fd = os.memfd_create("forged")
    os.write(fd, BIG)
    return fd


def _grown(make: Callable[[bytes], Path], _: Path) -> int:
    return os.open(make(BIG + b"MORE"), os.O_RDONLY)


def _shrunk(make: Callable[[bytes], Path], _: Path) -> int:
    return os.open(make(BIG[:-1]), os.O_RDONLY)


def _directory(_: Callable[[bytes], Path], __: Path) -> int:
    return os.open(SHM, os.O_RDONLY | os.O_DIRECTORY)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm tmpfs")
@pytest.mark.parametrize(
    "forge", [_fifo, _socket, _on_disk, _writable, _hard_linked, _unlinked, _memfd, _grown, _shrunk, _directory]
)
def test_a_descriptor_to_anything_else_is_a_violation(
    forge: Callable[[Callable[[bytes], Path], Path], int], shm_file: Callable[[bytes], Path], tmp_path: Path
) -> None:
    """A FIFO or a socket (a read could wait), a file on disk (so could a remote one), a file open for writing,
    a second link, no link at all (a memfd, a deleted file), another size, a directory: refused, closed."""
    fd = forge(shm_file, tmp_path)
    ex = _exchange(_announced(), [fd])
    assert ex.failure is not None and ex.failure[0] == ErrorType.SANDBOX_VIOLATION, (forge.__name__, ex.failure)
    assert ex.files == {} or ex.context is None
    assert _closed(fd)


@pytest.mark.parametrize(
    ("name", "announced", "count"),
    [
        ("one descriptor too many", _announced(), 2),
        ("one descriptor too few", frame(result(files=[["a.bin", 3], ["big.bin", len(BIG)]], files_passed=TWO)), 1),
        ("descriptors with no file passed", _announced(passed=[]) + frame(BIG), 1),
        ("a passed file not announced", _announced(passed=["other.bin"]), 1),
        ("a file passed twice", _announced(passed=["big.bin", "big.bin"]), 2),
        ("an error result passing a file", frame({**ERROR_RESULT, "files_passed": ["big.bin"]}), 1),
    ],
)
def test_descriptors_that_do_not_match_the_announcement_are_a_violation(
    name: str, announced: bytes, count: int, shm_file: Callable[[bytes], Path]
) -> None:
    fds = [os.open(shm_file(BIG), os.O_RDONLY) for _ in range(count)]
    ex = _exchange(announced, fds)
    assert ex.failure is not None and ex.failure[0] == ErrorType.SANDBOX_VIOLATION, (name, ex.failure)
    assert all(_closed(fd) for fd in fds)


def test_a_descriptor_after_the_result_is_a_violation(shm_file: Callable[[bytes], Path]) -> None:
    fd, late = (os.open(shm_file(BIG), os.O_RDONLY) for _ in range(2))
    ex = _exchange(_announced(), [fd], [late])
    assert ex.failure is not None and ex.failure[0] == ErrorType.SANDBOX_VIOLATION
    assert ex.security_event is not None and ex.security_event.event == "data_after_result"
    assert _closed(fd) and _closed(late)


def test_a_flood_of_descriptors_is_held_at_the_bound_and_the_rest_closed() -> None:
    """A sandbox attaching descriptors to every byte it writes on the result socket: the host holds at most
    ``MAX_RECEIVED_FDS`` of them and says so (truncated: a violation at the result), closing the rest at once."""
    host, sandbox_end = result_channel()
    io = SocketIO(socket.socket(fileno=os.dup(host.fileno())), {host.fileno(): "result"}, host)
    sandbox = socket.socket(fileno=sandbox_end)
    before = len(os.listdir("/proc/self/fd"))
    try:
        for _ in range(10):
            socket.send_fds(sandbox, [b"x"], [sandbox.fileno()] * 8)
        received = b""
        while len(received) < 10:
            received += b"".join(chunk for _, chunk in io.poll(1.0))
        assert len(os.listdir("/proc/self/fd")) <= before + MAX_RECEIVED_FDS
        fds, truncated = io.take_fds()
        assert len(fds) == MAX_RECEIVED_FDS and truncated
        for fd in fds:
            os.close(fd)
    finally:
        sandbox.close()
        io.close()


def test_read_passed_output_refuses_a_file_that_changed_size_while_read(
    shm_file: Callable[[bytes], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before and after the read: a file that grows in between (a writer the runner did not see)."""
    path = shm_file(BIG)
    fd = os.open(path, os.O_RDONLY)
    pread = os.pread

    def pread_then_grow(fd_: int, size: int, offset: int) -> bytes:
        data = pread(fd_, size, offset)
        with path.open("ab") as more:
            more.write(b"MORE")
        return data

    monkeypatch.setattr(os, "pread", pread_then_grow)
    try:
        with pytest.raises(PassedOutputRefused, match="changed its size"):
            read_passed_output(fd, len(BIG))
    finally:
        os.close(fd)


# --- end to end, subprocess -----------------------------------------------------------------------------


def test_a_large_output_comes_back_as_its_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner passes the large output's descriptor; a small one still comes as a frame."""
    read: list[int] = []

    def spy(fd: int, size: int) -> bytes:
        read.append(size)
        return read_passed_output(fd, size)

    monkeypatch.setattr(exchange_module, "read_passed_output", spy)
    code = (
        "with open('inputs/big.bin', 'rb') as f:\n    data = f.read()\n"
        "open('outputs/copy.bin', 'wb').write(data)\nopen('outputs/note.txt', 'w').write('hi')\nreturn 1"
    )
    with contextlib.closing(SubprocessBackend(SandboxConfig(pool_size=0))) as backend:
        out = backend.spawn(Limits()).execute(ExecutionRequest(code=code, files={"big.bin": BIG}), None)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.files == {"copy.bin": BIG, "note.txt": b"hi"} and list(out.files) == ["copy.bin", "note.txt"]
    assert read == [len(BIG)]


FORGE = """
import json, os, socket
with open('outputs/big.bin', 'wb') as f:
    f.write(b'x' * SIZE)
forged = FORGED
header = json.dumps({"type": "result", "status": "ok", "value": 1, "files": [["big.bin", SIZE]],
                     "files_passed": ["big.bin"]}).encode()
sock = socket.socket(fileno=os.dup(result_fd))
sock.sendmsg([len(header).to_bytes(4, "big") + header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                          forged.to_bytes(4, "little"))])
os._exit(0)
"""


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ("os.open('outputs/big.bin', os.O_RDWR)", "open for writing"),
        ("os.pipe()[0]", "not a regular file"),
        ("os.open('outputs', os.O_RDONLY)", "not a regular file"),
        ("(os.link('outputs/big.bin', 'outputs/again'), os.open('outputs/big.bin', 0))[1]", "one link"),
        ("(open('outputs/big.bin', 'ab').write(b'MORE'), os.open('outputs/big.bin', 0))[1]", "bytes, announced"),
    ],
)
def test_an_escaped_program_forging_a_passed_output_gets_nothing(forged: str, why: str) -> None:
    """A program past both walls writes its own result frame and attaches a descriptor of its choosing: a
    writable one (it could keep writing while the host reads), a pipe, a directory, a second link, a file that
    grew after the announcement. The host refuses each: a violation, no file."""
    code = FORGE.replace("SIZE", str(len(BIG))).replace("FORGED", forged)
    limits = Limits(timeout_s=10, memory_mb=256, disk_mb=4)
    with contextlib.closing(SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)) as backend:
        out = backend.spawn(limits).execute(ExecutionRequest(code=code, limits=limits), None)
    assert out.error_type is ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message, out.stderr)
    assert why in (out.error_message or "") and out.files == {}


def test_a_writable_mapping_left_by_the_program_changes_nothing_the_host_reads() -> None:
    """A program past both walls keeps a shared writable mapping of its output when it returns: the runner
    still passes a read-only descriptor of exactly the size it checked, and nothing runs after the return
    to write through the mapping (no thread, no process: seccomp), so the host gets the bytes as written."""
    code = (
        "import mmap\nf = open('outputs/big.bin', 'w+b')\nf.write(b'a' * SIZE)\nf.flush()\n"
        "m = mmap.mmap(f.fileno(), SIZE)\nm[:3] = b'xyz'\nreturn len(m)"
    ).replace("SIZE", str(len(BIG)))
    limits = Limits(timeout_s=10, memory_mb=256, disk_mb=4)
    with contextlib.closing(SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)) as backend:
        out = backend.spawn(limits).execute(ExecutionRequest(code=code, limits=limits), None)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    assert out.value == len(BIG)
    assert out.files == {"big.bin": b"xyz" + b"a" * (len(BIG) - 3)}
