"""A model API on loopback that speaks the providers' wire formats, for tests that drive the real SDKs.

Bodies follow the public API references: the chat-completions object of OpenAI's API reference (``choices[]``
with ``message.tool_calls[].function.arguments`` as a JSON *string*, ``finish_reason``, ``usage.prompt_tokens``
/ ``completion_tokens``; errors as ``{"error": {"message", "type", "param", "code"}}``) and the Messages object
of Anthropic's (``content[]`` blocks, ``stop_reason``, ``usage.input_tokens`` / ``output_tokens``; errors as
``{"type": "error", "error": {"type", "message"}}``, 529 ``overloaded_error``). A test queues replies (or gives a
function of the request) and reads back every request the SDK sent, headers included.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandforge.runtime.providers.prompt import PROGRAM_TOOL_NAME


@dataclass
class Reply:
    """One HTTP answer. ``body`` is JSON (dict) or raw bytes; ``hold`` makes the server wait on the
    server's release event before answering (a timeout, without a timing assumption)."""

    status: int = 200
    body: dict[str, Any] | bytes = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    hold: bool = False


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") or []
        return [str(t.get("function", t).get("name")) for t in tools]


class WireServer:
    """``handler`` answers each request; ``queue(*replies)`` makes it answer in order (the last one repeats)."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.release = threading.Event()
        self._replies: list[Reply] = []
        self.handler: Callable[[Seen], Reply] = self._next
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import time

                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw or b"{}"), time.monotonic())  # fmt: skip
                with server._lock:
                    server.requests.append(seen)
                reply = server.handler(seen)
                if reply.hold:
                    server.release.wait(30)
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", reply.headers.pop("content-type", "application/json"))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (a timeout test)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> WireServer:
        self._replies = list(replies)
        self.handler = self._next
        return self

    def _next(self, seen: Seen) -> Reply:
        with self._lock:
            reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
        return Reply(reply.status, reply.body, dict(reply.headers), reply.hold)

    def start(self) -> WireServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def wire_server() -> Iterator[WireServer]:
    server = WireServer().start()
    try:
        yield server
    finally:
        server.stop()


# --- OpenAI chat completions ------------------------------------------------------------------------------


def completion(
    *, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, finish_reason: str | None = None,
    model: str = "gpt-test", usage: tuple[int, int] = (19, 10),
) -> dict[str, Any]:  # fmt: skip
    """A ``chat.completion`` object as the API reference shows it."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": 0, "message": message, "logprobs": None,
              "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}  # fmt: skip
    details = {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
               "rejected_prediction_tokens": 0}  # fmt: skip
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1741569952,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": details,
        },
        "service_tier": "default",
        "system_fingerprint": None,
    }  # fmt: skip


def function_call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_abc123") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def program_completion(code: str, **kwargs: Any) -> dict[str, Any]:
    return completion(tool_calls=[function_call(PROGRAM_TOOL_NAME, {"code": code})], **kwargs)


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> Reply:
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})


# --- Anthropic messages -----------------------------------------------------------------------------------


def message(content: list[dict[str, Any]], stop_reason: str = "tool_use", model: str = "claude-test") -> dict[str, Any]:
    """A Messages API ``message`` object as the API reference shows it."""
    return {
        "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }  # fmt: skip


def program_message(code: str, **kwargs: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": PROGRAM_TOOL_NAME,
             "input": {"code": code}}  # fmt: skip
    return message([block], **kwargs)


def anthropic_error(status: int, message_text: str, kind: str) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message_text}})
