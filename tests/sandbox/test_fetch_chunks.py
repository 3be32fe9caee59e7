"""Frames that reach the host in one poll are judged together, however the channel cut them into chunks:
Docker's attach stream hands each write of the runner over as a chunk of its own, and a fetch (or call)
frame followed in the same poll by another frame was written without reading its reply: a violation."""

from __future__ import annotations

from typing import Any

from sandforge.sandbox import ErrorType, ExecutionRequest
from sandforge.sandbox.channel import Stream
from sandforge.sandbox.exchange import ExitInfo, build_outcome, run_exchange
from tests.sandbox.test_fetch_wire import FETCH, LIMITS, OK, Handler, denied_reply
from tests.sandbox.test_host_channel import ScriptedIO, frame


class ChunkedIO(ScriptedIO):
    """Each poll returns every chunk of one batch at once, as separate chunks (one per runner write)."""

    def __init__(self, *batches: list[bytes]) -> None:
        super().__init__()
        self.batches: list[list[tuple[Stream, bytes]]] = [[("result", c) for c in batch] for batch in batches]
        self.batches.append([("result", b""), ("stdout", b""), ("stderr", b"")])

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        return self.batches.pop(0) if self.batches else []


def outcome(io: ChunkedIO, handler: Any) -> Any:
    ex = run_exchange(io, ExecutionRequest(code="return 1", limits=LIMITS), handler)
    return build_outcome(ex, ExitInfo(exit_code=0), backend="test", protections={}, limits=LIMITS)


def test_a_flood_cut_into_one_chunk_per_frame_is_a_violation() -> None:
    handler = Handler(*[denied_reply()] * 10)
    flood = [frame({**FETCH, "id": i}) for i in range(10)]
    out = outcome(ChunkedIO(flood), handler)
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
    assert "wrote past a nested fetch" in (out.error_message or "")
    assert handler.requests == []  # the first frame had company: none was served


def test_a_frame_cut_across_chunks_of_one_poll_is_still_one_frame() -> None:
    whole = frame({**FETCH, "id": 0})
    handler = Handler(denied_reply())
    out = outcome(ChunkedIO([whole[:3], whole[3:20], whole[20:]], [frame(OK)]), handler)
    assert out.ok and len(handler.requests) == 1


def test_output_beside_the_frames_is_still_captured() -> None:
    io = ChunkedIO([frame({**FETCH, "id": 0})], [frame(OK)])
    io.batches[0].insert(0, ("stderr", b"warning\n"))
    out = outcome(io, Handler(denied_reply()))
    assert out.ok and "warning" in (out.stderr or "")
