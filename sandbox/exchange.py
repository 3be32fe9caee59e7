"""One execution's conversation with a runner, independent of how the bytes travel.

Backends provide a ``WorkerIO`` (``sandbox/channel.py``: pipes and sockets; Docker's attach socket); this
module owns everything that must behave identically on all of them: framing, ordering, the nested-call bridge,
bounded capture of stdout/stderr, the wall-clock deadline, and turning what happened into an outcome.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from sandforge.sandbox.channel import PipedBody, Stream, WorkerIO
from sandforge.sandbox.context import SEALED_MIN_BYTES, ContextError, ContextSnapshot, SealedText, decode_value
from sandforge.sandbox.files import PassedOutputRefused, read_passed_output
from sandforge.sandbox.inside.compilation import host_compiled
from sandforge.sandbox.inside.wire import FETCH_ERROR_KINDS, MAX_PASSED_FDS, ExecuteFrame
from sandforge.sandbox.inside.wire import dumps as wire_dumps
from sandforge.sandbox.protocol import (
    HEADER,
    PROTOCOL_VERSION,
    BridgeReply,
    CallFrame,
    CallResultFrame,
    DeclareFrame,
    ErrorType,
    ExecutionOutcome,
    ExecutionRequest,
    FetchFrame,
    FetchReplyWire,
    FrameReader,
    FrameTooLarge,
    Limits,
    ProtocolError,
    ReadyFrame,
    ResourceUsage,
    ResultFrame,
    SecurityEvent,
    decode_runner_frame,
    encode_frame,
)
from sandforge.sandbox.steps import Blocking, Cancelled, Chunks, Poll, Steps, run_steps

#: What a bridge handler answers: a :class:`BridgeReply`, or a mapping with its fields (``status``, ``value``,
#: ``error_type``, ``error_message``, ``retriable``), turned into one by ``BridgeReply.of``.
Reply = BridgeReply | Mapping[str, Any]
#: Answers a nested ``tool(...)``/``delegate(...)`` call made inside the sandbox. A handler that is also a
#: :class:`DeclareHandler` answers ``declare`` frames (``delegate(...)`` ran: stage the contract) with ok or an
#: ``invalid_contract`` error; for any other a declaration is acknowledged and nothing is staged.
BridgeHandler = Callable[[CallFrame], Reply]


@runtime_checkable
class DeclareHandler(Protocol):
    """A bridge handler that stages ``delegate(...)`` contracts."""

    def declare(self, frame: DeclareFrame) -> Reply: ...


@runtime_checkable
class EgressHandler(Protocol):
    """A bridge handler that brokers the program's requests (``fetch()``, ``urllib``/``requests``):
    ``request`` is a ``FetchRequest`` as JSON bytes (``runtime/egress/wire.py``), the answer a ``FetchReply``
    as JSON bytes; ``deadline`` is the execution's ``time.monotonic()`` deadline (fetching is charged to it).
    A handler without ``egress`` answers every fetch with ``egress_denied``; nothing is sent anywhere."""

    def egress(self, request: bytes, deadline: float) -> bytes: ...


@runtime_checkable
class EgressRequestHandler(Protocol):
    """An egress handler that takes the request as the exchange parsed it from the program's frame (a
    mapping with ``FetchRequest``'s fields) and answers the ``FetchReply`` as a mapping (``body_b64`` empty)
    with the body apart: the frame is parsed once, nothing is encoded and parsed again between the two.
    Preferred over ``egress_parts`` and ``egress`` when present; ``body`` is None for an error reply, and may
    be a ``PipedBody`` (spliced into the channel, never read into this process where the channel allows)."""

    def egress_request(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[Mapping[str, Any], bytes | PipedBody | None]: ...


@runtime_checkable
class EgressPartsHandler(Protocol):
    """An egress handler that can also give a response's body as raw bytes beside a ``FetchReply`` whose
    ``body_b64`` is empty (``EgressSession.handle_parts``): the body then reaches the program without a
    base64 round trip. Preferred over ``egress`` when present; ``body`` is None for an error reply."""

    def egress_parts(self, request: bytes, deadline: float) -> tuple[bytes, bytes | None]: ...


TRUNCATION_MARK = "\n[... truncated by sandforge]"
#: How long after a complete result the host waits for the channel's end and the worker's exit, even past
#: the deadline: a container's runtime tears it down before the stream ends (tens of ms; more under load).
END_GRACE_S = 2.0
#: How long the host waits for a worker's exit once its channel has ended before it kills the worker. A runner
#: exits at once; but under load its pid-1 mirror (a runner started without a zygote: ``lockdown._become_pid1``)
#: or its zygote may wait to be scheduled, and a kill that lands before the mirror reaps the program loses the
#: program's CPU time from the host's account, so a CPU-limit kill would read as an outside kill. Only a
#: runner that keeps running after closing its channel (an escaped program) ever waits this out.
EXIT_GRACE_S = 5.0
log = logging.getLogger(__name__)

_SERVING = threading.local()


def serving_deadline() -> float | None:
    """The ``time.monotonic()`` deadline of the execution whose nested call this thread is answering (None
    outside a bridge call): a nested call must end by then, since its time is charged to that execution."""
    deadline: float | None = getattr(_SERVING, "deadline", None)
    return deadline


@contextlib.contextmanager
def serving(deadline: float | None) -> Iterator[None]:
    """Answer a nested frame under ``deadline`` (what ``serving_deadline`` tells the handler): used where the
    frame comes from elsewhere than this process's exchange (a cluster node, ``sandbox/cluster``)."""
    outer, _SERVING.deadline = serving_deadline(), deadline
    try:
        yield
    finally:
        _SERVING.deadline = outer


def no_bridge(call: CallFrame) -> BridgeReply:
    return BridgeReply.error(
        "nested_calls_unavailable",
        f"tool {call.target.name!r} is not available: this execution has no agent to delegate to",
    )


_ACKNOWLEDGED = BridgeReply(status="ok")
_MALFORMED = BridgeReply.error("internal_error", "the host answered the nested call with a malformed reply")
_TOO_LARGE = BridgeReply.error("output_limit", "nested result too large")
_NOT_JSON = BridgeReply.error("internal_error", "the host answered the nested call with a value that is not JSON")
_NO_EGRESS = FetchReplyWire.failure(
    "egress_denied",
    "this execution has no egress: grant http_fetch and list egress.allow entries in the policy",
    "no_egress",
)
_MALFORMED_FETCH = FetchReplyWire.failure(
    "network_error", "the host could not broker the request: its broker answered with a malformed reply", "internal"
)


def _answer(handler: BridgeHandler, frame: CallFrame | DeclareFrame) -> BridgeReply:
    """The handler's reply to one nested frame (the one place that tells a declaration from a call)."""
    if isinstance(frame, DeclareFrame):
        reply: Reply = handler.declare(frame) if isinstance(handler, DeclareHandler) else _ACKNOWLEDGED
    else:
        reply = handler(frame)
    try:
        return BridgeReply.of(reply)
    except ValidationError:
        return _MALFORMED


@dataclass
class BoundedCapture:
    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> str:
        body = self.data.decode("utf-8", "replace")
        return body + TRUNCATION_MARK if self.truncated else body


@dataclass
class Exchange:
    """What the runner said and did during one execution, before the backend adds exit information.

    ``result`` is the result frame; the texts of the keys it lists as changed follow it as frames of their
    own (``changed``), and once all have arrived, ``context`` is the request's snapshot with the changes
    applied (only for an ok result)."""

    result: ResultFrame | None = None
    failure: tuple[ErrorType, str] | None = None
    base_context: ContextSnapshot = field(default_factory=ContextSnapshot)
    changed: dict[str, bytes] = field(default_factory=dict)
    context: ContextSnapshot | None = None
    #: The output files (``result.files``), each checked against its announcement, after the changed keys.
    files: dict[str, bytes] = field(default_factory=dict)
    stderr: BoundedCapture = field(default_factory=lambda: BoundedCapture(0))
    stray_stdout: BoundedCapture = field(default_factory=lambda: BoundedCapture(0))
    wall_s: float = 0.0
    bridge_s: float = 0.0
    #: Nested frames answered so far, by frame type (``call``, ``declare``, ``fetch``): each type has its own ids.
    served: dict[str, int] = field(default_factory=lambda: {"call": 0, "declare": 0, "fetch": 0})
    deadline: float | None = None
    #: The error kinds this execution's fetches were answered with: the only fetch kinds its result may claim.
    fetch_errors: set[str] = field(default_factory=set)
    fetch_s: float = 0.0
    #: The receipt the last ``fetch_result`` carried: the next fetch frame must echo it (``_check_nested``).
    receipt: str | None = None
    #: What the host saw that a confined program could never cause (anything after the result).
    security_event: SecurityEvent | None = None

    @property
    def nested_calls(self) -> int:
        return self.served["call"]

    @property
    def declarations(self) -> int:
        return self.served["declare"]

    @property
    def complete(self) -> bool:
        """The result frame and every changed key's and output file's frame after it have arrived."""
        result = self.result
        return (
            result is not None
            and len(self.changed) == len(result.context_changed)
            and len(self.files) == len(result.files)
        )


def await_ready(io: WorkerIO, limits: Limits, timeout: float) -> ReadyFrame:
    """Wait for the runner's ``ready`` frame after boot; anything else means the worker is unusable. What came
    after it in the same reads is counted in ``io.early_bytes`` (the exchange refuses it)."""
    reader = FrameReader(limits.max_message_bytes)
    deadline = time.monotonic() + timeout
    stderr = BoundedCapture(4096)
    ready: ReadyFrame | None = None
    while ready is None and (remaining := deadline - time.monotonic()) > 0:
        for stream, chunk in io.poll(remaining):
            if stream == "stderr":
                stderr.add(chunk)
            elif stream == "result":
                ready = _starting(io, reader, chunk, ready, stderr)
        if ready is not None:
            io.early_bytes += reader.pending
    if ready is None:
        raise ProtocolError(f"worker did not report ready within {timeout:.1f}s")
    return ready


def _starting(
    io: WorkerIO, reader: FrameReader, chunk: bytes, ready: ReadyFrame | None, stderr: BoundedCapture
) -> ReadyFrame | None:
    """One chunk of the result channel during start-up: the ready frame once it is whole (checked), and what
    follows it counted in ``io.early_bytes`` (an end there is a worker gone before use, which the exchange sees)."""
    if ready is not None:
        io.early_bytes += len(chunk)
        return ready
    if not chunk:
        raise ProtocolError(f"worker exited during start-up: {stderr.text().strip()[-500:]}")
    for body in reader.feed(chunk):
        if ready is None:
            ready = _ready_frame(body)
        else:
            io.early_bytes += HEADER.size + len(body)
    return ready


def _ready_frame(body: bytes) -> ReadyFrame:
    frame = decode_runner_frame(body)
    if not isinstance(frame, ReadyFrame):
        raise ProtocolError(f"expected a ready frame, got {frame.type!r}")
    if frame.version != PROTOCOL_VERSION:
        raise ProtocolError(f"the runner speaks protocol {frame.version}, the host {PROTOCOL_VERSION}")
    return frame


def run_exchange(io: WorkerIO, request: ExecutionRequest, bridge: BridgeHandler | None) -> Exchange:
    """Send the program, serve nested calls, collect the single result frame, enforce the limits.

    It then reads the result channel to its end (the worker exiting): a program that escaped can write a
    result frame before the runner's, so only the whole channel shows whether that one was the only one.
    The exchange's steps, driven on this thread (``sandbox/steps.py``).
    """
    return run_steps(exchange_steps(io, request, bridge))


def exchange_steps(io: WorkerIO, request: ExecutionRequest, bridge: BridgeHandler | None) -> Steps[Exchange]:
    """:func:`run_exchange` as steps: it yields where it waits (for output, for a nested call's answer), so
    the sync and async APIs drive one implementation. A :class:`~sandbox.steps.Cancelled` thrown in where it
    waits ends the exchange as a timeout does (the worker is then killed by its backend)."""
    limits = request.limits
    handler = bridge or no_bridge
    ex = Exchange(stderr=BoundedCapture(limits.max_output_bytes), stray_stdout=BoundedCapture(limits.max_output_bytes))
    reader = FrameReader(limits.max_message_bytes)
    started = time.monotonic()
    allowed = limits.timeout_s if request.wall_budget_s is None else min(limits.timeout_s, request.wall_budget_s)
    deadline = started + allowed  # never extended: time spent in nested calls is charged to this execution
    outer = serving_deadline()  # run from a bridge: a nested execution never outlives its caller's
    if outer is not None and outer < deadline:
        deadline, allowed = outer, max(outer - started, 0.0)
    ex.deadline = deadline
    if io.early_bytes:
        early = f"{io.early_bytes} bytes after the ready report, before any program"
        _protocol_broken(ex, "data_before_execute", early)
        return ex
    try:
        ex.base_context = ContextSnapshot.coerce(request.context)  # a snapshot unless built without validation
        send_execute(io, request, ex.base_context, limits.max_message_bytes, deadline=deadline)
    except (ProtocolError, ContextError) as exc:
        ex.failure = (ErrorType.INVALID_REQUEST, str(exc))
        return ex
    except TimeoutError:
        ex.failure = (ErrorType.TIMEOUT, f"the sandbox did not take the program within the {limits.timeout_s:g}s limit")
        return ex
    except OSError as exc:
        ex.failure = (ErrorType.SANDBOX_UNAVAILABLE, f"could not send the program to the sandbox: {exc}")
        return ex
    open_streams: set[Stream] = {"result", "stdout", "stderr"}
    ending: float | None = None  # once the result is complete: its channel may end up to END_GRACE_S later
    while open_streams and ex.failure is None:
        if ex.complete and ending is None:
            ending = max(deadline, time.monotonic() + END_GRACE_S)
        until = deadline if ending is None else ending
        if until - time.monotonic() <= 0:
            ex.failure = (ErrorType.TIMEOUT, _timeout_message(limits.timeout_s, allowed))
            break
        if (yield from _one_poll(io, reader, ex, handler, limits, until, open_streams)):
            break
        if ex.stderr.truncated or ex.stray_stdout.truncated:
            ex.failure = (ErrorType.OUTPUT_LIMIT, f"the sandbox wrote more than {limits.max_output_bytes} bytes")
        if ex.complete and "result" not in open_streams:
            break
    _check_the_end(io, reader, ex)
    ex.wall_s = time.monotonic() - started - ex.bridge_s
    return ex


def _check_the_end(io: WorkerIO, reader: FrameReader, ex: Exchange) -> None:
    """After the channel ended: nothing may follow a complete result, and a result begun must be complete."""
    late, _ = io.take_fds()  # descriptors after the result (or with no result): closed, and never the runner's
    for fd in late:
        with contextlib.suppress(OSError):
            os.close(fd)
    if ex.failure is None and ex.complete and late:
        _protocol_broken(ex, "data_after_result", f"{len(late)} descriptors after the result")
    if ex.failure is None and ex.complete and reader.pending:
        _protocol_broken(ex, "data_after_result", f"{reader.pending} bytes of an unfinished frame after the result")
    elif ex.failure is None and not ex.complete and (ex.result is not None or reader.pending):
        ex.failure = (ErrorType.SANDBOX_VIOLATION, "the sandbox sent an incomplete result")


def _one_poll(
    io: WorkerIO, reader: FrameReader, ex: Exchange, handler: BridgeHandler, limits: Limits, deadline: float,
    open_streams: set[Stream],
) -> Steps[bool]:  # fmt: skip
    """Wait for output until ``deadline``, then serve the frames that came; True when the exchange must stop
    (``ex.failure`` says why)."""
    try:
        polled: Chunks = yield Poll(io, max(deadline - time.monotonic(), 0.0))
    except Cancelled:
        _cancelled(ex)
        return True
    results = _sort_chunks(polled, ex, open_streams)
    if not results:
        return False
    try:
        yield from _handle_frames(io, reader, reader.feed(results), ex, handler, limits, deadline)
    except Cancelled:
        _cancelled(ex)
        return True
    except ProtocolError as exc:
        ex.failure = (ErrorType.SANDBOX_VIOLATION, f"the sandbox broke the protocol: {exc}")
        ex.context = None
        return True
    except TimeoutError:
        ex.failure = _blocked_reply(io, limits)
        if ex.failure[0] is ErrorType.SANDBOX_VIOLATION:
            ex.context = None
        return True
    return False


#: Why an exchange ended when its caller cancelled it (an asyncio task): it ends as a timeout does.
CANCELLED_MESSAGE = "the caller cancelled the execution"


def _cancelled(ex: Exchange) -> None:
    ex.failure = (ErrorType.TIMEOUT, CANCELLED_MESSAGE)
    ex.context = None


def _sort_chunks(chunks: list[tuple[Stream, bytes]], ex: Exchange, open_streams: set[Stream]) -> bytes:
    """Output into its captures, closed streams out of ``open_streams``; the result channel's bytes of this
    poll as one piece. Served together, so that frames that came in one poll are judged together: a channel
    that hands each write over as a chunk of its own (Docker's attach stream) must not let a frame written
    past a nested call pass as if it came alone (``_check_nested``)."""
    results: list[bytes] = []
    for stream, chunk in chunks:
        if not chunk:
            open_streams.discard(stream)
        elif stream == "stderr":
            ex.stderr.add(chunk)
        elif stream == "stdout":
            ex.stray_stdout.add(chunk)
        else:
            results.append(chunk)
    return results[0] if len(results) == 1 else b"".join(results)


def _timeout_message(limit_s: float, allowed_s: float) -> str:
    if allowed_s < limit_s:
        return f"execution exceeded its {allowed_s:.3g}s share of the caller's time (nested calls included)"
    return f"execution exceeded the {limit_s:g}s time limit (nested calls included)"


# At most ``MAX_PASSED_FDS`` context values travel as descriptors in one execution (the runner accepts no more).


def fd_budget(limits: Limits) -> int:
    """How many descriptors one execute frame may pass: at most ``MAX_PASSED_FDS``, and leaving the runner
    (whose open-files limit is ``max_open_files``, with a few already open) ample room."""
    return max(0, min(MAX_PASSED_FDS, (limits.max_open_files - 16) // 2))


def send_execute(
    io: WorkerIO, request: ExecutionRequest, context: ContextSnapshot, max_bytes: int, fd_limit: int | None = None,
    *, deadline: float | None = None,
) -> None:  # fmt: skip
    """The execute frame, then each context key's text as a frame of its own, ``max_bytes`` in all.

    The texts are sent as the snapshot holds them: nothing is encoded or escaped again. Small frames are
    coalesced into one write; a large text is written as it is rather than copied into a buffer. Where the
    channel can pass descriptors (``io.passes_fds``), the largest texts (up to ``fd_budget``) travel as sealed
    memfds attached to the execute frame instead: announced as ``[key, length, index]``, not copied at all;
    where the worker has a confirmed hand-off directory (``io.handoff``), they are written there as files.
    """
    passes_fds, handoff = io.passes_fds, io.handoff
    limit = fd_budget(request.limits) if fd_limit is None else fd_limit
    passed: dict[str, int] = {}
    fds: list[int] = []
    if (passes_fds or handoff is not None) and limit > 0:
        large = sorted((k for k, t in context.items() if len(t) >= SEALED_MIN_BYTES), key=lambda k: -len(context[k]))
        chosen = set(large[:limit])
        for key in (k for k in context if k in chosen):
            if handoff is not None:
                index = len(passed)
                with contextlib.suppress(OSError):  # e.g. no space left: the value goes as a frame
                    handoff.put(index, context, key)
                    passed[key] = index
            elif (handle := context.sealed(key)) is not None:
                passed[key] = len(fds)
                fds.append(handle.fd)
    keys = [[key, len(text), passed[key]] if key in passed else [key, len(text)] for key, text in context.items()]
    # ``_held`` keeps the input files' memfds open until they are sent (then the kernel holds them).
    sent_files, _held = _pass_files(io, request, len(passed) if handoff is not None else len(fds), limit, fds)
    # A plain dict (a TypedDict), not a model: the request's fields are validated already, and re-validating
    # them through a model cost measurable CPU for large arguments.
    frame: ExecuteFrame = {"type": "execute", "code": request.code, "args": request.args, "kwargs": request.kwargs,
             "context_keys": keys}  # fmt: skip
    compiled = host_compiled(request.code)  # compiled once per program text here, not in every sandbox
    if compiled is not None:
        frame["compiled"] = compiled
    if request.environment is not None:
        frame["env_id"] = request.environment.env_id
    if request._tripwire_canary:
        frame["canary"] = True
    if request.files:
        frame["files"] = [[name, len(body), sent_files[name]] if name in sent_files else [name, len(body)]
                          for name, body in request.files.items()]  # fmt: skip
    framed_files = [body for name, body in request.files.items() if name not in sent_files]
    header = encode_frame(frame, max_bytes)
    total = len(header) + context.nbytes + HEADER.size * (len(context) - len(passed))
    # A large input's frame goes onto the runner's disk as it comes: the files' limits bound it, not this one.
    total += sum(HEADER.size + len(body) for body in framed_files if len(body) < SEALED_MIN_BYTES)
    if total > max_bytes:
        raise ProtocolError(f"the request of {total} bytes exceeds the {max_bytes}-byte limit")
    pending = bytearray(header)

    def flush(data: bytes) -> None:
        if fds and passes_fds:
            io.send_fds(data, fds, deadline)  # the descriptors ride on the execute frame's first byte
            fds.clear()
        else:
            io.send(data, deadline)

    # The context texts not passed otherwise, then the input files not passed, in the announced order.
    for text in [t for k, t in context.items() if k not in passed] + framed_files:
        pending += HEADER.pack(len(text))
        if len(text) < 1 << 16:
            pending += text
            continue
        flush(bytes(pending))
        pending.clear()
        io.send(text, deadline)
    if pending:
        flush(bytes(pending))


def _pass_files(
    io: WorkerIO, request: ExecutionRequest, first: int, limit: int, fds: list[int]
) -> tuple[dict[str, int], list[SealedText]]:
    """The input files that travel as the context's large values do (the descriptors left after the
    context's, largest first): each as a sealed memfd appended to ``fds`` (``io.passes_fds``) or a file of the
    hand-off directory (``io.handoff``), by the index announced as ``[name, length, index]``. Both are made
    from the request's bytes by one write; the runner copies each onto its disk before the program runs.
    Returns the indices by name, and the memfds to keep open until the frame is sent. Where neither is
    possible (no memfd, the hand-off directory full), or the channel streams inputs (``io.streams_inputs``),
    the file goes as a frame, which the runner writes onto its disk as it comes."""
    room = limit - first
    if room <= 0 or io.streams_inputs or not (io.passes_fds or io.handoff is not None):
        return {}, []
    large = sorted((n for n, b in request.files.items() if len(b) >= SEALED_MIN_BYTES),
                   key=lambda n: -len(request.files[n]))[:room]  # fmt: skip
    sent: dict[str, int] = {}
    held: list[SealedText] = []
    for name in large:
        index = first + len(sent)
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: no os.memfd_create here
            if io.handoff is not None:
                io.handoff.put_bytes(index, request.files[name])
            else:
                held.append(SealedText(request.files[name], "sandforge-input"))
                fds.append(held[-1].fd)
            sent[name] = index
    return sent, held


def _accept_result(ex: Exchange, frame: ResultFrame, size: int, limits: Limits) -> None:
    """Check what a result frame announces before any of its key frames is read: every field within what
    the runner can produce for this request (a forged frame must gain nothing over returning a value)."""
    max_bytes = limits.max_message_bytes
    changed = [key for key, _ in frame.context_changed]
    deleted = frame.context_deleted
    if frame.status != "ok" and (changed or deleted or frame.files or frame.files_passed):
        raise ProtocolError("an error result carries context changes or files")
    _accept_files(frame, limits)
    if (frame.status == "ok") == (frame.error is not None):
        raise ProtocolError("an ok result with an error, or an error result without one")
    if frame.status != "ok" and frame.value is not None:
        raise ProtocolError("an error result carries a value")
    for name in ("stdout", "stderr"):
        text: str = getattr(frame, name)
        if len(text) > limits.max_output_bytes and len(text.encode("utf-8", "replace")) > limits.max_output_bytes:
            raise ProtocolError(f"the result's {name} exceeds the {limits.max_output_bytes}-byte output limit")
    if len(set(changed)) != len(changed) or len(set(deleted)) != len(deleted) or set(changed) & set(deleted):
        raise ProtocolError("the result names a context key twice")
    if any(key not in ex.base_context for key in deleted):
        raise ProtocolError("the result deletes a context key the request did not have")
    announced = [*frame.context_changed, *_framed_files(frame)]
    total = size + sum(HEADER.size + nbytes for _, nbytes in announced)
    if total > max_bytes:
        raise ProtocolError(f"the result announces {total} bytes (limit {max_bytes})")
    ex.result = frame
    _finish_context(ex)


def _accept_files(frame: ResultFrame, limits: Limits) -> None:
    """The output files a result announces, within the request's bounds (the runner checked the same: a
    result past them is forged)."""
    names = [name for name, _ in frame.files]
    if len(set(names)) != len(names):
        raise ProtocolError("the result names an output file twice")
    if len(names) > limits.max_files:
        raise ProtocolError(f"the result announces {len(names)} output files (limit {limits.max_files})")
    sizes = [nbytes for _, nbytes in frame.files]
    if any(nbytes > limits.max_file_bytes for nbytes in sizes) or sum(sizes) > limits.max_files_bytes:
        raise ProtocolError("the result announces output files past the request's bounds")
    passed = frame.files_passed
    if len(set(passed)) != len(passed) or not set(passed) <= set(names):
        raise ProtocolError("the result passes a descriptor for an output file it does not announce, or twice")


def _framed_files(frame: ResultFrame) -> list[tuple[str, int]]:
    """The output files whose bytes follow as frames (the others came as descriptors), in announced order."""
    passed = frame.files_passed
    return [(name, size) for name, size in frame.files if name not in passed] if passed else frame.files


def _take_passed_outputs(io: WorkerIO, ex: Exchange, frame: ResultFrame) -> None:
    """The output files the result passes as descriptors: exactly those attached to the channel's bytes so
    far (any other descriptor, or one too many or too few, is a forged result), each checked and read once
    (``read_passed_output``), then closed."""
    fds, truncated = io.take_fds()
    try:
        if truncated or len(fds) != len(frame.files_passed):
            passed = len(frame.files_passed)
            raise ProtocolError(f"the result passes {passed} output files, {len(fds)} descriptors came")
        sizes = dict(frame.files)
        for name, fd in zip(frame.files_passed, fds, strict=True):
            try:
                ex.files[name] = read_passed_output(fd, sizes[name])
            except (PassedOutputRefused, OSError) as exc:
                raise ProtocolError(f"output file {name!r}: {exc}") from None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    _finish_context(ex)


def _accept_context_text(ex: Exchange, body: bytes) -> None:
    """One changed key's new text: exactly the announced length, and JSON (checked in Rust, not Python);
    after the last of them, each output file's bytes."""
    assert ex.result is not None
    if ex.complete:
        event, detail = ("second_result", "a second result frame") if _is_result(body) else (
            "data_after_result", "data after the result frame")  # fmt: skip
        _protocol_broken(ex, event, detail)
        raise ProtocolError(detail)
    if len(ex.changed) == len(ex.result.context_changed):
        name, size = _framed_files(ex.result)[len(ex.files) - len(ex.result.files_passed)]
        if len(body) != size:
            raise ProtocolError(f"output file {name!r} is {len(body)} bytes, announced {size}")
        ex.files[name] = body
        _finish_context(ex)
        return
    key, nbytes = ex.result.context_changed[len(ex.changed)]
    if len(body) != nbytes:
        raise ProtocolError(f"context key {key!r} is {len(body)} bytes, announced {nbytes}")
    try:
        decode_value(body, f"context key {key!r}")
    except ContextError as exc:
        raise ProtocolError(str(exc)) from None
    ex.changed[key] = body
    _finish_context(ex)


def _is_result(body: bytes) -> bool:
    try:
        return isinstance(frame := json.loads(body), dict) and frame.get("type") == "result"
    except (ValueError, RecursionError):
        return False


def _protocol_broken(ex: Exchange, event: str, detail: str) -> None:
    """Anything on the result channel after a complete result, or between the ready report and the program:
    the runner writes one result and exits, and nothing before it has the program, so something else wrote
    this (a program that forged a result before the runner's own, or after it)."""
    ex.failure = (ErrorType.SANDBOX_VIOLATION, f"the sandbox broke the protocol: {detail}")
    ex.context = None
    ex.security_event = SecurityEvent(source="host", event=event, detail=detail)


def _finish_context(ex: Exchange) -> None:
    if ex.complete and ex.result is not None and ex.result.status == "ok":
        ex.context = ex.base_context.with_changes(ex.changed, ex.result.context_deleted)
        if ex.result.files_passed:  # passed ones came first: the announced (name) order again
            ex.files = {name: ex.files[name] for name, _ in ex.result.files}


def _blocked_reply(io: WorkerIO, limits: Limits) -> tuple[ErrorType, str]:
    """Why a reply could not be sent before the deadline. A runner waiting for its reply writes nothing, so
    frames that arrived meanwhile mean the program flooded calls without reading: a violation, caught here
    where the channel cannot count unread bytes (``WorkerIO.unread``) and the flood came one frame per read.
    Otherwise the sandbox just stopped reading: the time limit."""
    if any(stream == "result" and chunk for stream, chunk in io.poll(0)):
        return ErrorType.SANDBOX_VIOLATION, (
            "the sandbox broke the protocol: the sandbox wrote past a nested call before reading its reply"
        )
    return ErrorType.TIMEOUT, f"execution exceeded the {limits.timeout_s:g}s time limit (the sandbox stopped reading)"


def _unread(io: WorkerIO) -> int:
    """Bytes the host sent that the worker has not read yet (0 where the channel cannot tell)."""
    try:
        return io.unread()
    except OSError:
        return 0


def _handle_frames(
    io: WorkerIO, reader: FrameReader, bodies: list[bytes], ex: Exchange, handler: BridgeHandler, limits: Limits,
    deadline: float,
) -> Steps[float]:  # fmt: skip
    """Process complete frames (steps: they wait for nested answers); returns the seconds spent in nested calls
    and fetches. They are charged to this
    call: ``deadline`` is never moved (see ``run_exchange``); the time is kept in ``ex.bridge_s`` (nested
    calls) and ``ex.fetch_s`` (fetches) for the record.

    A nested call (or fetch) is synchronous: after a ``call`` frame the runner writes nothing until it has
    read the whole reply. So anything after a call frame in the same read, and a call frame while a reply (or
    the request) still sits unread in the channel, is a protocol violation: a program that floods calls
    without reading is stopped at once instead of filling the channel until the host's send blocks."""
    paused = 0.0
    for index, body in enumerate(bodies):
        if ex.result is not None:
            _accept_context_text(ex, body)
            continue
        frame = decode_runner_frame(body)
        if isinstance(frame, ResultFrame):
            _accept_result(ex, frame, len(body), limits)
            _take_passed_outputs(io, ex, frame)
            continue
        if not isinstance(frame, CallFrame | DeclareFrame | FetchFrame):
            raise ProtocolError("a second ready frame")
        _check_nested(io, reader, index + 1 < len(bodies), ex, frame)
        began = time.monotonic()
        if isinstance(frame, FetchFrame):
            replies = yield from _serve_fetch(frame, ex, handler, limits)
        else:
            replies = [(yield from _serve_call(frame, ex, handler, limits))]
        spent = time.monotonic() - began
        paused += spent
        if isinstance(frame, FetchFrame):
            ex.fetch_s += spent
        else:
            ex.bridge_s += spent
        if time.monotonic() >= deadline:
            _discard(replies)
            return paused  # the nested call used up this execution's time: run_exchange reports the timeout
        # A worker that is gone (killed, out of memory) cannot take the reply: its exit tells what happened.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for reply in replies:
                if isinstance(reply, bytes):
                    io.send(reply, deadline)
                else:
                    io.send_piped(*reply, deadline)
    return paused


#: A reply to send: bytes, or a head and a body to splice after it (``WorkerIO.send_piped``).
Outgoing = bytes | tuple[bytes, PipedBody]


def _discard(replies: list[Outgoing]) -> None:
    for reply in replies:
        if not isinstance(reply, bytes):
            reply[1].close()


def _check_nested(
    io: WorkerIO, reader: FrameReader, more: bool, ex: Exchange, frame: CallFrame | DeclareFrame | FetchFrame
) -> None:
    """The ordering and flood rules every synchronous frame (call, declare, fetch) obeys."""
    if more or reader.pending:
        raise ProtocolError(f"the sandbox wrote past a nested {frame.type} before reading its reply")
    if _unread(io):
        raise ProtocolError(f"a nested {frame.type} arrived before the previous reply (or the request) was read")
    expected = ex.served[frame.type]  # calls, declarations and fetches are numbered separately
    if frame.id != expected:
        raise ProtocolError(f"nested {frame.type} {frame.id} out of order (expected {expected})")
    if isinstance(frame, FetchFrame) and frame.receipt != ex.receipt:
        raise ProtocolError(f"nested fetch {frame.id} without the receipt of the previous reply (it was not read)")


def _serve_call(frame: CallFrame | DeclareFrame, ex: Exchange, handler: BridgeHandler, limits: Limits) -> Steps[bytes]:
    answer: BridgeReply = yield Blocking(functools.partial(_answer_by, handler, frame, ex.deadline), interruptible=True)
    ex.served[frame.type] += 1
    try:
        return encode_frame(CallResultFrame(id=frame.id, outcome=answer).wire(), limits.max_message_bytes)
    except ProtocolError as exc:
        refusal = _TOO_LARGE if isinstance(exc, FrameTooLarge) else _NOT_JSON
        return encode_frame(CallResultFrame(id=frame.id, outcome=refusal).wire(), limits.max_message_bytes)


def _answer_by(handler: BridgeHandler, frame: CallFrame | DeclareFrame, deadline: float | None) -> BridgeReply:
    """The handler's reply, with ``deadline`` as this thread's serving deadline meanwhile (the thread that
    answers may be another than the exchange's: ``sandbox/aio.py``)."""
    outer, _SERVING.deadline = serving_deadline(), deadline
    try:
        return _answer(handler, frame)
    finally:
        _SERVING.deadline = outer


def _serve_fetch(frame: FetchFrame, ex: Exchange, handler: BridgeHandler, limits: Limits) -> Steps[list[Outgoing]]:
    """The ``fetch_result`` frame and, for a response, its body as one raw frame (written as it is, or
    spliced from the pipe that holds it)."""
    assert ex.deadline is not None
    fetched = functools.partial(_egress_reply, handler, frame, ex.deadline, limits.max_message_bytes)
    reply, body = yield Blocking(fetched, interruptible=True)
    ex.served["fetch"] += 1
    # Unguessable, so that only a runner that read this reply can send the next fetch: a runner writing
    # fetch frames without reading gets at most one served, on every backend.
    ex.receipt = secrets.token_hex(8)
    if reply.error is not None:
        ex.fetch_errors.add(reply.error.kind)
        return [encode_frame({**reply.header(frame.id, 0), "receipt": ex.receipt}, limits.max_message_bytes)]
    header = encode_frame({**reply.header(frame.id, len(body)), "receipt": ex.receipt}, limits.max_message_bytes)
    if isinstance(body, PipedBody):
        return [(header + HEADER.pack(len(body)), body)]
    if len(body) < 1 << 16:
        return [header + HEADER.pack(len(body)) + body]
    return [header + HEADER.pack(len(body)), body]


def _egress_reply(
    handler: BridgeHandler, frame: FetchFrame, deadline: float, max_bytes: int
) -> tuple[FetchReplyWire, bytes | PipedBody]:
    """The handler's answer to one fetch, checked: a reply the program may get, and the response's body
    (a piped body that is not sent on is closed here)."""
    reply, body = _egress_answer(handler, frame, deadline)
    if reply.response is not None and len(body) <= max_bytes - 1024:
        return reply, body
    if isinstance(body, PipedBody):
        body.close()
    if reply.response is None:
        return reply, b""
    message = f"the response of {len(body)} bytes exceeds the sandbox's {max_bytes}-byte message limit"
    return FetchReplyWire.failure("egress_limit", message, "message_limit"), b""


def _egress_answer(
    handler: BridgeHandler, frame: FetchFrame, deadline: float
) -> tuple[FetchReplyWire, bytes | PipedBody]:
    """The handler's reply, parsed, and its body; a typed failure for a malformed reply or a broker bug."""
    body: bytes | PipedBody | None = None
    # What ``isinstance`` with the runtime-checkable protocols tests (the method is there), at a fraction of
    # its cost (it walks the protocol's attributes on every call: ~5 us per fetch).
    try:
        parsed = getattr(handler, "egress_request", None)
        if parsed is not None:
            answer, body = parsed(frame.request, deadline)
            reply = FetchReplyWire.model_validate(answer)
        else:
            json_reply, body = _egress_json(handler, frame, deadline)
            if json_reply is None:
                return _NO_EGRESS, b""
            reply = json_reply
        if reply.response is not None and body is None:
            body = binascii.a2b_base64(reply.response.body_b64, strict_mode=True)
    except (ValidationError, binascii.Error, ValueError, TypeError):
        reply = _MALFORMED_FETCH
    except Exception:  # a broker bug must not end the exchange: the program gets a typed failure
        log.exception("egress handler failed")
        reply = _MALFORMED_FETCH
    return reply, b"" if body is None else body


def _egress_json(
    handler: BridgeHandler, frame: FetchFrame, deadline: float
) -> tuple[FetchReplyWire | None, bytes | None]:
    """A handler's answer through its JSON entry points (``egress_parts``, else ``egress``); (None, None)
    when it has neither."""
    request = wire_dumps(frame.request).encode()
    parts = getattr(handler, "egress_parts", None)
    whole = getattr(handler, "egress", None) if parts is None else None
    body: bytes | None = None
    if parts is not None:
        raw, body = parts(request, deadline)
    elif whole is not None:
        raw = whole(request, deadline)
    else:
        return None, None
    return FetchReplyWire.model_validate_json(raw), body


@dataclass
class ExitInfo:
    """How the worker ended, as the host observed it."""

    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    usage: ResourceUsage | None = None

    @property
    def observed(self) -> bool:
        """Whether the host saw the worker end (an exit status or a signal)."""
        return self.exit_code is not None or self.signal is not None


SIGKILL, SIGALRM, SIGXCPU, SIGSYS = 9, 14, 24, 31
#: Signals a sandbox cannot have sent itself: a program has no way to signal a process and the runner sends
#: only SIGALRM (its backstop), so these came from outside (the OOM killer, the runtime, an operator). A
#: sandbox they end without a result is not the program's ``execution`` error: it is ``sandbox_unavailable``.
FROM_OUTSIDE = frozenset({1, 2, 3, SIGKILL, 15})  # SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM
#: Host-measured CPU time at this share of the limit: the kernel's RLIMIT_CPU kill (soft = hard: SIGKILL)
CPU_LIMIT_SHARE = 0.8


#: An outcome's metadata key: the worker handed out had died before the request reached it, so nothing of the
#: program ran, and ``Sandbox`` runs it once more on a fresh worker before the caller sees this.
DIED_BEFORE_USE = "died_before_use"


def died_before_use(backend: str, what: str = "sandbox worker") -> ExecutionOutcome:
    """The outcome of a worker found dead when its execution began (under load, a start-up that failed late)."""
    return ExecutionOutcome.failure(
        ErrorType.SANDBOX_UNAVAILABLE, f"{what} died before use", backend=backend, metadata={DIED_BEFORE_USE: True}
    )


def build_outcome(
    ex: Exchange, exit_info: ExitInfo, *, backend: str, protections: dict[str, bool], limits: Limits
) -> ExecutionOutcome:
    """Combine the exchange and the exit into one outcome; host observations beat runner claims.

    An ok result also needs the clean exit the runner makes right after writing it: anything else means
    that it was not the runner that wrote it (a program that escaped forged it, then raised or was stopped),
    or that the runner did not finish. Every backend observes the exit (``ExitInfo.observed``)."""
    usage = exit_info.usage or ResourceUsage(
        cpu_time_s=ex.result.cpu_time_s if ex.result else 0.0,
        peak_memory_mb=ex.result.peak_memory_mb if ex.result else 0.0,
        source="sandbox",
    )
    common: dict[str, Any] = {
        "stderr": ex.stderr.text(),
        "stderr_truncated": ex.stderr.truncated,
        "duration_s": round(ex.wall_s, 6),
        "usage": usage,
        "backend": backend,
        "protections": protections,
        "metadata": {
            "nested_calls": ex.nested_calls,
            "exit_code": exit_info.exit_code,
            "signal": exit_info.signal,
            "bridge_s": round(ex.bridge_s, 6),
            "fetches": ex.served["fetch"],
            "fetch_s": round(ex.fetch_s, 6),
        },
    }
    stdout = ex.result.stdout if ex.result else ""
    stdout_truncated = ex.result.stdout_truncated if ex.result else False
    if ex.stray_stdout.data:
        stdout += ex.stray_stdout.text()
        stdout_truncated = stdout_truncated or ex.stray_stdout.truncated
    common["stdout"] = stdout + (TRUNCATION_MARK if stdout_truncated and ex.result else "")
    common["stdout_truncated"] = stdout_truncated

    failure = ex.failure
    if failure is not None and ex.security_event is not None:
        common["security_event"] = ex.security_event
    elif failure is None and ex.result is not None and ex.result.status == "ok":
        failure = _ok_exit_failure(exit_info, common)
    failure = failure or _exit_failure(ex, exit_info, limits, usage)
    if failure is not None:
        return ExecutionOutcome.failure(failure[0], failure[1], **common)
    result = ex.result
    assert result is not None
    if result.status == "error" and result.error is not None:
        err = result.error
        meta = {**common["metadata"], "exception": err.exception, "line": err.line}
        if err.type in FETCH_ERROR_KINDS and err.type not in ex.fetch_errors:
            message = f"the program raised {err.type} itself, but no fetch of this execution failed so: {err.message}"
            return ExecutionOutcome.failure(ErrorType.EXECUTION, message[:4096], **{**common, "metadata": meta})
        if err.tool_error_type:
            meta["tool_error_type"] = err.tool_error_type
        # Only a program's own Outcome.error says whether it may be retried; the runner's other errors are
        # the program's, never extrinsic (RETRIABLE holds none of the types a runner may send).
        retriable = err.retriable if err.type == ErrorType.TOOL_ERROR else None
        event = err.security_event if err.type == ErrorType.SANDBOX_VIOLATION else None
        return ExecutionOutcome.failure(
            err.type, err.message, retriable=retriable, security_event=event, **{**common, "metadata": meta}
        )
    if result.status != "ok" or ex.context is None:
        return ExecutionOutcome.failure(
            ErrorType.SANDBOX_VIOLATION, "the sandbox returned an incomplete result", **common
        )
    # Each changed key was checked as JSON when its frame arrived; the outcome decodes the context only if
    # someone reads ``outcome.context``.
    return ExecutionOutcome.succeeded(result.value, ex.context, files=ex.files, **common)


def _ok_exit_failure(exit_info: ExitInfo, common: dict[str, Any]) -> tuple[ErrorType, str] | None:
    """Why an ok result does not stand given the exit that followed it (None: it stands). Checked before
    the exit's other meanings: a memory or CPU kill after an ok is not the runner's, which exits at once."""
    if not exit_info.observed:
        return ErrorType.SANDBOX_UNAVAILABLE, "the host could not observe the sandbox's exit after its result"
    if exit_info.exit_code == 0 and exit_info.signal is None:
        return None
    how = f"signal {exit_info.signal}" if exit_info.signal else f"exit status {exit_info.exit_code}"
    common["security_event"] = SecurityEvent(source="host", event="unclean_exit_after_ok",
                                             detail=f"an ok result followed by {how}")  # fmt: skip
    return ErrorType.SANDBOX_VIOLATION, f"the sandbox reported success but ended with {how}"


def _exit_failure(
    ex: Exchange, exit_info: ExitInfo, limits: Limits, usage: ResourceUsage
) -> tuple[ErrorType, str] | None:
    if exit_info.oom_killed:
        return ErrorType.MEMORY_LIMIT, f"memory limit of {limits.memory_mb} MB exceeded"
    if exit_info.signal == SIGXCPU:
        return ErrorType.TIMEOUT, f"CPU time limit of {limits.effective_cpu_s}s exceeded"
    if exit_info.signal == SIGALRM:  # the runner's own wall-clock backstop (the host's deadline is earlier)
        return ErrorType.TIMEOUT, f"execution exceeded the {limits.timeout_s:g}s time limit"
    if ex.result is not None:
        return None
    if usage.peak_memory_mb >= 0.9 * limits.memory_mb:
        return ErrorType.MEMORY_LIMIT, f"memory limit of {limits.memory_mb} MB exceeded"
    if exit_info.signal == SIGSYS:
        return ErrorType.SANDBOX_VIOLATION, "the sandbox was killed for a forbidden system call"
    if not exit_info.observed:
        return ErrorType.SANDBOX_UNAVAILABLE, "the sandbox ended without a result, and the host could not see how"
    cpu_spent = usage.source == "host" and usage.cpu_time_s >= CPU_LIMIT_SHARE * limits.effective_cpu_s
    if exit_info.signal == SIGKILL and cpu_spent:
        return ErrorType.TIMEOUT, f"CPU time limit of {limits.effective_cpu_s}s exceeded"
    if exit_info.signal in FROM_OUTSIDE:
        return ErrorType.SANDBOX_UNAVAILABLE, (
            f"the sandbox was killed by signal {exit_info.signal}, which it cannot send itself (the OOM killer, the "
            "runtime or an operator): not the program's error, and retriable"
        )
    how = f"signal {exit_info.signal}" if exit_info.signal else f"exit code {exit_info.exit_code}"
    return ErrorType.EXECUTION, f"the sandbox ended without a result ({how})"
