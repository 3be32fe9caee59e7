"""Large context values travel to subprocess sandboxes as sealed memfds (SCM_RIGHTS), not as bytes.

The host seals each memfd against writing, growing and shrinking before it is passed; the runner accepts
only such descriptors, of exactly the announced size, and maps them read-only. A program that escapes
RestrictedPython can find the descriptor but cannot change the host's value through it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.docker_backend import AttachIO
from sandforge.sandbox.channel import PipeIO, SocketIO
from sandforge.sandbox.context import SEALED_MIN_BYTES, SEALS, ContextSnapshot, SealedText
from sandforge.sandbox.exchange import MAX_PASSED_FDS, fd_budget
from sandforge.sandbox.inside import channel as inside_channel
from sandforge.sandbox.protocol import HEADER
from tests.sandbox.test_os_boundary import escaped

BIG = "x" * (2 * SEALED_MIN_BYTES) + "end"


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1)) as sandbox:
        yield sandbox


class Traffic:
    """What the host wrote into sandboxes (through pipes, sockets or Docker's attach stream): bytes, and
    descriptors passed per execute frame."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        self.passed: list[int] = []
        send, send_fds, attach_send = PipeIO.send, SocketIO.send_fds, AttachIO.send

        def spy_send(io: PipeIO, data: bytes, deadline: float | None = None) -> None:
            self.bytes += len(data)
            send(io, data, deadline)

        def spy_attach_send(io: AttachIO, data: bytes, deadline: float | None = None) -> None:
            self.bytes += len(data)
            attach_send(io, data, deadline)

        def spy_send_fds(io: SocketIO, data: bytes, fds: list[int], deadline: float | None = None) -> None:
            self.passed.append(len(fds))
            send_fds(io, data, fds, deadline)

        monkeypatch.setattr(PipeIO, "send", spy_send)
        monkeypatch.setattr(AttachIO, "send", spy_attach_send)
        monkeypatch.setattr(SocketIO, "send_fds", spy_send_fds)


def test_a_large_value_is_passed_not_copied(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG, "small": [1, 2]})
    traffic = Traffic(monkeypatch)
    out = sb.execute(ExecutionRequest(code="return [context['small'], len(context['big'])]", context=snapshot))
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == [[1, 2], len(BIG)]
    assert traffic.passed == [1] and traffic.bytes < SEALED_MIN_BYTES  # the execute frame (and boot), no value
    after = out.context_snapshot
    assert after is not None and after["big"] is snapshot["big"]
    assert after.sealed("big") is snapshot.sealed("big")  # derived snapshots share the memfd


#: Where large values travel as descriptors, and where as files in a hand-off directory (sandbox/handoff.py).
PASSES_FDS = {"subprocess", "runc"}
HANDS_OFF = {"docker", "gvisor", "runsc"}


def test_each_backend_passes_or_hands_off_large_values(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """subprocess and runc pass the large value as a memfd; docker, gvisor and runsc put it into the
    container's hand-off directory. No backend copies it through its channel."""
    from sandforge.sandbox.handoff import HandoffDir

    snapshot = ContextSnapshot.from_dict({"big": BIG, "small": [1, 2]})
    traffic = Traffic(monkeypatch)
    put = HandoffDir.put
    handed: list[str] = []

    def spy_put(self: HandoffDir, index: int, context: ContextSnapshot, key: str) -> None:
        handed.append(key)
        put(self, index, context, key)

    monkeypatch.setattr(HandoffDir, "put", spy_put)
    request = ExecutionRequest(code="return [context['small'], context['big'][-3:]]", context=snapshot)
    out = sandbox.execute(request)
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == [[1, 2], "end"] and out.context_snapshot == snapshot
    assert traffic.passed == ([1] if sandbox.config.backend in PASSES_FDS else [])
    assert handed == (["big"] if sandbox.config.backend in HANDS_OFF else [])
    assert traffic.bytes < SEALED_MIN_BYTES  # the execute frame (and perhaps a boot frame), not the value


def test_a_passed_value_reads_changes_and_restores_like_any_other(sb: Sandbox) -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG, "rows": list(range(20_000))})
    code = "context['rows'].append(1)\ncontext['rows'].pop()\nreturn context['big'][-3:]"
    out = sb.execute(ExecutionRequest(code=code, context=snapshot))
    assert out.ok and out.value == "end"
    assert out.context_snapshot == snapshot and out.context_snapshot is not None
    assert out.context_snapshot["rows"] is snapshot["rows"]  # read, restored: not sent back
    out = sb.execute(ExecutionRequest(code="context['big'] = context['big'][:3]\nreturn 1", context=snapshot))
    assert out.ok and out.context == {"big": "xxx", "rows": list(range(20_000))}


def test_the_descriptor_budget_is_respected(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {f"k{i:02}": str(i) * (SEALED_MIN_BYTES + i) for i in range(MAX_PASSED_FDS + 6)}
    traffic = Traffic(monkeypatch)
    code = "return [len(context[k]) for k in context]"
    out = sb.execute(ExecutionRequest(code=code, context=values))
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == [len(v) for v in values.values()]
    assert traffic.passed == [MAX_PASSED_FDS]
    assert traffic.bytes >= 6 * SEALED_MIN_BYTES  # the smallest six travelled as frames
    # A small open-files limit leaves no room for descriptors: everything travels as frames.
    traffic.passed.clear()
    limits = Limits(max_open_files=16)
    out = sb.execute(ExecutionRequest(code=code, context=values, limits=limits))
    assert out.ok and out.value == [len(v) for v in values.values()] and traffic.passed == []
    assert fd_budget(Limits()) == MAX_PASSED_FDS and fd_budget(limits) == 0


ATTACK = """
import errno, fcntl, mmap, os
found = []
def attempt(tried, name, action):
    try:
        action()
        tried[name] = "done"
    except (OSError, ValueError, TypeError) as exc:
        tried[name] = getattr(exc, "errno", None) or type(exc).__name__
for fd in range(64):
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        continue
    tried = {"size": os.fstat(fd).st_size}
    attempt(tried, "write", lambda: os.write(fd, b"HACK"))
    attempt(tried, "pwrite", lambda: os.pwrite(fd, b"HACK", 0))
    attempt(tried, "truncate", lambda: os.ftruncate(fd, 1))
    attempt(tried, "grow", lambda: os.ftruncate(fd, os.fstat(fd).st_size + 1))
    def map_shared():
        m = mmap.mmap(fd, 4, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        m[:4] = b"HACK"
    attempt(tried, "mmap_shared", map_shared)
    attempt(tried, "unseal", lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0))
    found.append(tried)
for text in context._original.values():
    if hasattr(text, "map"):
        def write_map():
            text.map[:4] = b"HACK"
        tried = {}
        attempt(tried, "runner_map", write_map)
        found.append(tried)
back = {}
attempt(back, "stdin", lambda: os.write(INPUT_FD, b"x"))
found.append(back)
return found
"""


def test_an_escaped_program_cannot_change_a_passed_value(sb: Sandbox) -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    before = bytes(snapshot["big"])
    out = escaped(ATTACK.replace("INPUT_FD", "0"), context=snapshot)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    *memfds, runner_map, back = out.value
    assert memfds, "the attack found no passed memfd: the test would be vacuous"
    eperm = 1
    for tried in memfds:
        assert tried["size"] == len(before)
        for name in ("write", "pwrite", "truncate", "grow", "mmap_shared", "unseal"):
            assert tried[name] == eperm, (name, tried)
    assert runner_map == {"runner_map": "TypeError"}  # the runner's own mapping is read-only
    assert back == {"stdin": 32}  # EPIPE: the channel into the sandbox is one way
    assert snapshot["big"] == before
    sealed = snapshot.sealed("big")
    assert sealed is not None and os.pread(sealed.fd, len(before) + 1, 0) == before
    again = sb.execute(ExecutionRequest(code="return context['big'][:4] + context['big'][-3:]", context=snapshot))
    assert again.ok and again.value == "xxxxend"


# --- the runner's checks, called directly ---------------------------------------------------------------


def memfd(data: bytes, seals: int = SEALS) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.mark.parametrize(
    ("seals", "size", "needle"),
    [
        (0, 5, "not sealed"),
        (fcntl.F_SEAL_WRITE, 5, "not sealed"),
        (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK, 5, "not sealed"),
        (SEALS, 4, "holds 5 bytes, announced 4"),
        (SEALS, 6, "holds 5 bytes, announced 6"),
    ],
)
def test_the_runner_refuses_unsealed_or_wrong_size_memfds(seals: int, size: int, needle: str) -> None:
    fd = memfd(b'"abc"', seals)
    try:
        with pytest.raises(inside_channel.PassedTextError, match=needle):
            inside_channel.map_text(fd, size)
    finally:
        os.close(fd)


def test_the_runner_refuses_descriptors_that_are_not_memfds(tmp_path: Any) -> None:
    r, w = os.pipe()
    path = tmp_path / "f"
    path.write_bytes(b'"abc"')
    f = os.open(path, os.O_RDONLY)
    try:
        for fd in (r, w, f):
            with pytest.raises(inside_channel.PassedTextError, match="not a sealed memfd"):
                inside_channel.map_text(fd, 5)
    finally:
        for fd in (r, w, f):
            os.close(fd)


def test_the_runner_maps_a_sealed_memfd_read_only() -> None:
    fd = memfd(b'"abc"')
    try:
        text = inside_channel.map_text(fd, 5)
    finally:
        os.close(fd)
    assert text.map is not None
    with pytest.raises(TypeError):
        text.map[:1] = b"x"
    assert len(text) == 5 and text.read() == b'"abc"' and text.map is None


def forged(
    header: dict[str, Any],
    fds: list[int],
    *frames: bytes,
    later_fds: list[int] | None = None,
    handoff: str | None = None,
) -> Any:
    """Feed the runner's ``read_execute`` what a forged host side sends; returns what it read or raised."""
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    body = json.dumps({"type": "execute", "code": "return 1", "args": [], "kwargs": {}, **header}).encode()
    if fds:
        socket.send_fds(host, [HEADER.pack(len(body)) + body], fds)
    else:
        host.sendall(HEADER.pack(len(body)) + body)
    for i, text in enumerate(frames):
        data = HEADER.pack(len(text)) + text
        if later_fds and i == 0:
            socket.send_fds(host, [data], later_fds)
        else:
            host.sendall(data)
    host.close()
    channel = inside_channel.Channel(sandbox.detach())
    try:
        return inside_channel.read_execute(channel, 1 << 20, handoff)
    except ValueError as exc:
        return exc
    finally:
        assert channel.sock is not None
        channel.sock.close()


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_runner_reads_announced_descriptors() -> None:
    fd = memfd(b'"abc"')
    got = forged({"context_keys": [["a", 1], ["big", 5, 0]]}, [fd], b"1")
    os.close(fd)
    assert not isinstance(got, Exception), got
    _frame, raw = got
    assert bytes(raw["a"]) == b"1" and raw["big"].read() == b'"abc"'


@pytest.mark.parametrize(
    ("keys", "nfds", "later", "needle"),
    [
        ([["a", 1]], 1, 0, "not announced"),  # a descriptor nobody announced
        ([["a", 1], ["big", 5, 0]], 2, 0, "not announced"),  # one too many
        ([["a", 1], ["big", 5, 1]], 1, 0, "which was not passed"),  # an index beyond those passed
        ([["a", 1], ["big", 5, 0], ["c", 5, 0]], 1, 0, "which was not passed"),  # one descriptor twice
        ([["a", 1], ["big", 5, 0]], 0, 0, "which was not passed"),  # announced, never sent
        ([["a", 1], ["big", 5, True]], 1, 0, "which was not passed"),
        ([["a", 1]], 0, 1, "came with a context frame"),  # attached to a later frame
        ([["a", 1]], 0, MAX_PASSED_FDS + 1, "came with a context frame|more descriptors"),
    ],
)
def test_the_runner_refuses_unexpected_descriptors(keys: list[Any], nfds: int, later: int, needle: str) -> None:
    fds = [memfd(b'"abc"') for _ in range(max(nfds, later))]
    before = open_fds()
    got = forged({"context_keys": keys}, fds[:nfds], b"1", later_fds=fds[:later] or None)
    for fd in fds:
        os.close(fd)
    assert isinstance(got, inside_channel.PassedTextError), got
    assert got.args and re.search(needle, str(got.args[0]))
    assert open_fds() <= before  # every received descriptor was closed


def test_too_many_descriptors_with_the_execute_frame_are_refused() -> None:
    fds = [memfd(b'"abc"') for _ in range(MAX_PASSED_FDS + 1)]
    keys = [["a", 1], *([f"k{i}", 5, i] for i in range(MAX_PASSED_FDS + 1))]
    before = open_fds()
    got = forged({"context_keys": keys}, fds, b"1")
    for fd in fds:
        os.close(fd)
    assert isinstance(got, inside_channel.PassedTextError) and "more descriptors" in str(got)
    assert open_fds() <= before


def test_a_forged_descriptor_is_an_invalid_request_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host side that passes an unsealed memfd gets invalid_request back, and nothing runs."""
    import sandforge.sandbox.context as context_module

    class Unsealed(SealedText):
        def __init__(self, text: bytes, name: str = "x") -> None:
            self.fd = memfd(text, 0)
            self.size = len(text)

    monkeypatch.setattr(context_module, "SealedText", Unsealed)
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sandbox:
        out = sandbox.execute(ExecutionRequest(code="return 1", context={"big": BIG}))
    assert not out.ok and out.error_type == "invalid_request" and "not sealed" in (out.error_message or "")
