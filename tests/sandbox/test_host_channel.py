"""The host's side of the sandbox channel holds against a runner that is not the runner (issue 13, items 2, 3).

An attacker who escaped RestrictedPython controls the runner process: it can write any bytes on the result
channel and stop reading its input. The host must neither hang (every read and write is bounded by the
execution's deadline) nor accept more from a forged frame than the program could get by returning a value.

Unit tests drive ``run_exchange`` with scripted workers; the end-to-end tests run attacks through the
escaped runners on every backend (``escaped_runner.py``, and the container bootstrap of
``test_container_boundary.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox.backends import docker_backend, oci_backend
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.backends.docker_backend import DockerBackend
from sandforge.sandbox.backends.oci_backend import OciBackend
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.channel import Stream, WorkerIO
from sandforge.sandbox.exchange import ExitInfo, await_ready, build_outcome, run_exchange
from sandforge.sandbox.protocol import HEADER, PROTOCOL_VERSION, CallFrame, ProtocolError, decode_runner_frame
from tests.conftest import BACKEND_PARAMS
from tests.sandbox.test_container_boundary import ESCAPED_BOOTSTRAP

ESCAPED = Path(__file__).with_name("escaped_runner.py")
LIMITS = Limits(timeout_s=4, memory_mb=256, disk_mb=4, max_output_bytes=8192)


def frame(body: bytes | dict[str, Any]) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HEADER.pack(len(data)) + data


# --- strict result frames --------------------------------------------------------------------------------

OK = {"type": "result", "status": "ok", "value": 1}
REFUSED_FRAMES = {
    "NaN value": b'{"type":"result","status":"ok","value":NaN}',
    "Infinity inside the value": b'{"type":"result","status":"ok","value":[1,{"a":-Infinity}]}',
    "overflowing literal": b'{"type":"result","status":"ok","value":1e400}',
    "overflowing literal deep inside": b'{"type":"result","status":"ok","value":{"a":[2,-1.5E+999]}}',
    "overflowing cpu time": b'{"type":"result","status":"ok","value":1,"cpu_time_s":1e400}',
    "negative memory": json.dumps({**OK, "peak_memory_mb": -1}).encode(),
    "host-only error: timeout": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "timeout", "message": "slow"}}
    ).encode(),
    "host-only error: guardrail_violation": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "guardrail_violation", "message": "x"}}
    ).encode(),
    "host-only error: sandbox_unavailable": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "sandbox_unavailable", "message": "x"}}
    ).encode(),
    "exception name too long": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "execution", "message": "x", "exception": "E" * 201}}
    ).encode(),
    "message too long": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "execution", "message": "x" * 5000}}
    ).encode(),
    "ok with an error": json.dumps({**OK, "error": {"type": "execution", "message": "x"}}).encode(),
    "nested 202 deep": b'{"type":"result","status":"ok","value":' + b"[" * 201 + b"]" * 201 + b"}",
}


@pytest.mark.parametrize("body", list(REFUSED_FRAMES.values()), ids=list(REFUSED_FRAMES))
def test_forged_result_fields_are_refused(body: bytes) -> None:
    try:
        decoded = decode_runner_frame(body)
    except ProtocolError:
        return
    out = exchange_with(frame(body))  # refused by the exchange's checks (they need the request)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (decoded, out)


def test_the_deepest_value_the_runner_sends_is_accepted() -> None:
    body = b'{"type":"result","status":"ok","value":' + b"[" * 200 + b"]" * 200 + b"}"
    assert decode_runner_frame(body).value is not None


class ScriptedIO(WorkerIO):
    """A worker that answers with the given result-channel bytes (in one read), then ends."""

    def __init__(self, *chunks: bytes, unread: int = 0) -> None:
        self.sent = bytearray()
        self.pending: list[tuple[Stream, bytes]] = [("result", c) for c in chunks]
        self.pending += [("result", b""), ("stdout", b""), ("stderr", b"")]
        self._unread = unread

    def send(self, data: bytes, deadline: float | None = None) -> None:
        self.sent += data

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        if not self.pending:
            return []
        return [self.pending.pop(0)]

    def unread(self) -> int:
        return self._unread


def exchange_with(
    *chunks: bytes, limits: Limits = LIMITS, unread: int = 0, exit_code: int = 0, exit_info: ExitInfo | None = None
) -> ExecutionOutcome:
    io = ScriptedIO(*chunks, unread=unread)
    ex = run_exchange(io, ExecutionRequest(code="return 1", limits=limits), lambda call: {"status": "ok"})
    info = exit_info or ExitInfo(exit_code=exit_code)
    return build_outcome(ex, info, backend="test", protections={}, limits=limits)


def test_stdout_beyond_the_output_limit_is_refused() -> None:
    out = exchange_with(frame({**OK, "stdout": "x" * (LIMITS.max_output_bytes + 1)}))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "output limit" in (out.error_message or "")
    assert exchange_with(frame({**OK, "stdout": "x" * LIMITS.max_output_bytes})).ok


def test_an_ok_result_needs_a_clean_exit() -> None:
    assert exchange_with(frame(OK)).ok
    out = exchange_with(frame(OK), exit_code=70)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "exit status 70" in (out.error_message or "")
    assert out.security_event is not None and out.security_event.event == "unclean_exit_after_ok"
    # A memory kill after an ok is no more the runner's than any other signal: it exits right after its result.
    out = exchange_with(frame(OK), exit_info=ExitInfo(exit_code=137, signal=9, oom_killed=True))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "signal 9" in (out.error_message or "")
    assert out.security_event is not None and out.security_event.source == "host"


READY = {"type": "ready", "version": PROTOCOL_VERSION, "pid": 7, "protections": {}}


@pytest.mark.parametrize("early", [frame(OK), frame(OK)[:3]], ids=["a whole result", "a frame's first bytes"])
def test_bytes_after_the_ready_report_and_before_the_program_are_a_violation(early: bytes) -> None:
    """The runner writes nothing between its ready report and the program's frame (it has no program yet): what
    came in the reads that brought the report is counted, and the exchange refuses the worker before it sends
    the program, whatever those bytes would have said."""
    io = ScriptedIO(frame(READY) + early)
    assert await_ready(io, LIMITS, 5.0).pid == 7
    assert io.early_bytes == len(early)
    ex = run_exchange(io, ExecutionRequest(code="return 1", limits=LIMITS), None)
    out = build_outcome(ex, ExitInfo(exit_code=0), backend="test", protections={}, limits=LIMITS)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and out.value is None and out.context is None
    assert out.security_event is not None and out.security_event.event == "data_before_execute"
    assert io.sent == b""  # the program never went to that worker


def test_a_ready_report_alone_leaves_nothing_early() -> None:
    io = ScriptedIO(frame(READY))
    assert await_ready(io, LIMITS, 5.0).version == PROTOCOL_VERSION
    assert io.early_bytes == 0
    assert exchange_with(frame(OK)).ok


class LateEndIO(ScriptedIO):
    """A worker whose channel ends ``late_s`` after its result (a container's teardown), or never."""

    def __init__(self, late_s: float | None) -> None:
        super().__init__(frame(OK))
        self.late_s = late_s

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        if len(self.pending) == 4:  # the result
            return [self.pending.pop(0)]
        if self.late_s is None:
            time.sleep(min(timeout, 0.05))
            return []
        time.sleep(self.late_s)
        self.late_s = 0.0
        return super().poll(timeout)


def test_the_channel_may_end_after_the_deadline_once_the_result_is_complete() -> None:
    """The end of a complete result's channel is awaited up to END_GRACE_S past the deadline (a container's
    teardown); a channel still open then is a timeout, never the ok it carried."""
    limits = Limits(timeout_s=0.2)
    request = ExecutionRequest(code="return 1", limits=limits)
    late = run_exchange(LateEndIO(0.5), request, None)
    assert late.failure is None and late.complete
    never = run_exchange(LateEndIO(None), request, None)
    assert never.failure is not None and never.failure[0] == ErrorType.TIMEOUT
    assert build_outcome(never, ExitInfo(exit_code=0), backend="test", protections={}, limits=limits).value is None


def test_an_ok_result_whose_exit_was_not_seen_does_not_stand() -> None:
    out = exchange_with(frame(OK), exit_info=ExitInfo())
    assert out.error_type == ErrorType.SANDBOX_UNAVAILABLE and out.value is None and out.context is None


@pytest.mark.parametrize(
    ("after", "event"),
    [
        (frame({"type": "result", "status": "error", "error": {"type": "execution", "message": "x"}}), "second_result"),
        (frame(OK), "second_result"),
        (frame(b"[1]"), "data_after_result"),
        (b"\0\0", "data_after_result"),  # an unfinished frame, then the channel's end
    ],
    ids=["second error result", "second ok result", "a frame", "partial frame"],
)
def test_anything_after_the_result_is_a_host_security_event(after: bytes, event: str) -> None:
    for chunks in ((frame(OK) + after,), (frame(OK), after)):  # in the result's read, or in a later one
        out = exchange_with(*chunks)
        assert out.error_type == ErrorType.SANDBOX_VIOLATION and out.value is None and out.context is None
        assert out.security_event is not None
        assert (out.security_event.source, out.security_event.event) == ("host", event)


def test_runner_errors_are_never_retriable_unless_the_program_said_so() -> None:
    forged = {"type": "result", "status": "error", "error": {"type": "execution", "message": "x", "retriable": True}}
    assert exchange_with(frame(forged)).retriable is False
    own = {"type": "result", "status": "error",
           "error": {"type": "tool_error", "message": "x", "retriable": True, "tool_error_type": "busy"}}  # fmt: skip
    assert exchange_with(frame(own)).retriable is True


CALL = {"type": "call", "target": {"kind": "tool", "name": "t"}, "method": "m", "args": [], "kwargs": {}}


def test_a_call_followed_by_anything_before_its_reply_is_a_violation() -> None:
    out = exchange_with(frame({**CALL, "id": 0}) + frame({**CALL, "id": 1}))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "before reading its reply" in (out.error_message or "")
    out = exchange_with(frame({**CALL, "id": 0}) + b"\0\0")  # even a partial frame
    assert out.error_type == ErrorType.SANDBOX_VIOLATION


def test_a_call_while_the_previous_reply_is_unread_is_a_violation() -> None:
    out = exchange_with(frame({**CALL, "id": 0}), unread=12)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "was read" in (out.error_message or "")


def test_calls_must_come_in_order() -> None:
    out = exchange_with(frame({**CALL, "id": 5}))
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and "out of order" in (out.error_message or "")
    assert exchange_with(frame({**CALL, "id": 0}), frame({**CALL, "id": 1}), frame(OK)).ok


# --- attacks through an escaped runner, on every backend -------------------------------------------------

FIND_CHANNELS = """
import json, os, struct, sys, time
f = sys._getframe()
while 'out_fd' not in f.f_locals:
    f = f.f_back
out = f.f_locals['out_fd']
def send(obj):
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    view = memoryview(struct.pack('>I', len(body)) + body)
    while view:
        view = view[os.write(out, view):]
"""


@pytest.fixture(params=BACKEND_PARAMS)
def escaped(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """Each backend with a runner whose program runs as unrestricted Python (a full escape)."""
    config = SandboxConfig(pool_size=0)
    backend: Backend
    if request.param == "subprocess":
        backend = SubprocessBackend(config, runner=ESCAPED)
    else:
        request.getfixturevalue("docker_env")
        command = ["-I", "-S", "-B", "-c", ESCAPED_BOOTSTRAP]
        monkeypatch.setattr(docker_backend, "COMMAND", ["python3", *command])
        monkeypatch.setattr(oci_backend, "COMMAND", ["/usr/bin/python3", *command])
        if request.param in ("runc", "runsc"):
            backend = OciBackend(config, runtime=request.param)  # type: ignore[arg-type]
        else:
            backend = DockerBackend(config, runtime="runsc" if request.param == "gvisor" else None)
    try:
        yield backend
    finally:
        backend.close()


def attack(backend: Backend, code: str, bridge: Any = None, limits: Limits = LIMITS) -> tuple[ExecutionOutcome, float]:
    worker = backend.spawn(limits)
    began = time.monotonic()
    out = worker.execute(ExecutionRequest(code=FIND_CHANNELS + code, limits=limits), bridge)
    return out, time.monotonic() - began


@pytest.mark.timeout(90)
def test_a_flood_of_calls_without_reading_is_a_violation(escaped: Backend) -> None:
    code = f"for i in range(20000):\n    send({{**{CALL!r}, 'id': i}})\ntime.sleep(60)\nreturn 1"
    out, took = attack(escaped, code)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    assert took < LIMITS.timeout_s + 10, took


@pytest.mark.timeout(90)
def test_a_flood_of_calls_one_frame_at_a_time_is_a_violation(escaped: Backend) -> None:
    """Frames spaced out so that each read holds one, on channels that cannot count unread bytes (docker's
    attach socket): the flood shows when the host's reply cannot be sent while frames keep arriving."""
    spaced = f"for i in range(20000):\n    send({{**{CALL!r}, 'id': i}})\n    time.sleep(0.0002)\n"
    code = spaced + "time.sleep(60)\nreturn 1"
    out, took = attack(escaped, code)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    assert took < LIMITS.timeout_s + 10, took


@pytest.mark.timeout(90)
def test_a_runner_that_stops_reading_cannot_hold_the_host(escaped: Backend) -> None:
    """One call, then never read the (large) reply: the host's send is bounded by the deadline."""

    def big_reply(call: CallFrame) -> dict[str, Any]:
        return {"status": "ok", "value": "x" * (24 << 20)}

    code = f"send({{**{CALL!r}, 'id': 0}})\ntime.sleep(120)\nreturn 1"
    out, took = attack(escaped, code, big_reply)
    assert out.error_type == ErrorType.TIMEOUT, (out.error_type, out.error_message)
    assert took < LIMITS.timeout_s + 15, took


FORGED_RESULTS = {
    "NaN": b'{"type":"result","status":"ok","value":NaN}',
    "1e400": b'{"type":"result","status":"ok","value":[1e400]}',
    "2 MB stdout": json.dumps({**OK, "stdout": "x" * (2 << 20)}).encode(),
    "timeout claimed": json.dumps(
        {"type": "result", "status": "error", "error": {"type": "timeout", "message": "x"}}
    ).encode(),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("body", list(FORGED_RESULTS.values()), ids=list(FORGED_RESULTS))
def test_forged_result_frames_are_violations_on_every_backend(escaped: Backend, body: bytes) -> None:
    out, _ = attack(escaped, f"send({body!r})\nos._exit(0)")
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    assert out.value is None and out.context is None


#: What an escaped program does after writing a forged ok result: raise (the runner then writes its own error
#: result and exits 0), exit non-zero, or die of a signal (a fault: the runner is pid 1 of its namespace in a
#: container, where a signal it sends itself is ignored).
AFTER_A_FORGED_OK = {
    "raises": ("raise RuntimeError('after the forged result')", "second_result"),
    "exits non-zero": ("os._exit(70)", "unclean_exit_after_ok"),
    "killed by a signal": ("import ctypes\nctypes.string_at(0)", "unclean_exit_after_ok"),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("then", list(AFTER_A_FORGED_OK), ids=list(AFTER_A_FORGED_OK))
def test_a_forged_ok_is_refused_on_every_backend(escaped: Backend, then: str) -> None:
    """The host reads the result channel to its end and judges an ok result with the exit status, on every
    backend (containers used to stop at the first result frame and never see the exit)."""
    code, event = AFTER_A_FORGED_OK[then]
    forged = {**OK, "value": "forged", "context_changed": [["admin", 4]]}
    send_forged = f"send({forged!r})\nsend(b'true')\n"
    request = ExecutionRequest(code=FIND_CHANNELS + send_forged + code, context={"admin": False}, limits=LIMITS)
    out = escaped.spawn(LIMITS).execute(request, None)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message, out.stderr[-500:])
    assert out.security_event is not None, out.error_message
    assert (out.security_event.source, out.security_event.event) == ("host", event)
    assert out.value is None and out.context is None
