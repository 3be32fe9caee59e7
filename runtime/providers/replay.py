"""Record a live model's exchanges, and replay them: reproduce a bug report, regression-test the lifecycle
against real model text, with no model and no network.

``RecordingProvider(provider, path)`` (and ``RecordingChatProvider`` for a chat session's model) passes every
call through and appends one JSON line per exchange to ``path``: what the runtime asked (the
``GenerationRequest``, or the chat request), what came back (the program or the chat answer, or the typed
error), its token usage and timing. Values of the process's secrets (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``,
``*_PASSWORD`` variables, and any ``secrets=`` given) never reach the file: they are replaced before the line
is written. Lines are appended atomically (``runtime.files.append_line``).

``ReplayProvider(path)`` (``ReplayChatProvider``) answers from such a file, in order, and refuses to guess:
when the runtime asks something the recording did not see, it raises :class:`ReplayMismatch` naming the
exchange and the first differing field (``time_budget_s``, the wall-clock seconds a call has left, is the one
field never compared: it is a measurement, not a question).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import append_line, decode_json, read_user_file
from sandforge.runtime.providers.base import (
    GeneratedProgram,
    GenerationRequest,
    InvalidProviderOutput,
    Provider,
    ProviderError,
)
from sandforge.runtime.providers.chat import ChatProvider, ChatProviderError, ChatRequest, ChatResponse

FORMAT = 1
MAX_RECORDING_BYTES = 256 << 20
REDACTED = "[redacted]"
#: Environment variables whose values are secrets wherever they appear.
SECRET_ENV = re.compile(r"(API_KEY|AUTH_TOKEN|TOKEN|SECRET|PASSWORD)$")
#: Request fields that are measurements, not questions: recorded, never compared.
UNCOMPARED = frozenset({"time_budget_s"})

ExchangeKind = Literal["program", "chat"]


class RecordedError(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    error_type: str = Field(description="provider, invalid_provider_output, or chat_provider")
    kind: str
    message: str
    retriable: bool


class Exchange(BaseModel):
    """One line of a recording: one model call, as the runtime saw it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    kind: ExchangeKind
    seq: int = Field(ge=1, description="its place among the recording's exchanges of this kind")
    provider: str
    model: str | None = None
    started_at: datetime
    duration_s: float = Field(ge=0)
    request: dict[str, JsonValue]
    response: dict[str, JsonValue] | None = None
    error: RecordedError | None = None
    usage: dict[str, int] = Field(default_factory=dict)


class ReplayMismatch(ProviderError):
    """The runtime asked what the recording did not see (or more than it holds). Never retriable: a replay
    that diverged can only be re-recorded."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False, kind="replay_mismatch")


class ReplayChatMismatch(ChatProviderError):
    """A chat session asked what the recording did not see."""


# --- secrets ----------------------------------------------------------------------------------------------


def secret_values(extra: Iterable[str] = ()) -> list[str]:
    """The values to keep out of a recording: the secret variables' and ``extra``, longest first (a key that
    contains another is replaced whole)."""
    found = {v for name, v in os.environ.items() if SECRET_ENV.search(name) and len(v) >= 8}
    found |= {v for v in extra if v and len(v) >= 4}
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
        escaped = json.dumps(secret)[1:-1]  # as it appears inside a JSON string
        if escaped != secret:
            text = text.replace(escaped, REDACTED)
    return text


# --- comparing --------------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _object_difference(recorded: dict[str, Any], asked: dict[str, Any], path: str) -> str | None:
    for key in [*recorded, *(k for k in asked if k not in recorded)]:
        if not path and key in UNCOMPARED:
            continue
        where = f"{path}.{key}" if path else key
        if key not in asked:
            return f"{where}: recorded {_show(recorded[key])}, asked nothing"
        if key not in recorded:
            return f"{where}: recorded nothing, asked {_show(asked[key])}"
        found = first_difference(recorded[key], asked[key], where)
        if found:
            return found
    return None


def first_difference(recorded: Any, asked: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (``args[0]: recorded 3, asked 4``), or None when they are equal."""
    here = path or "(the whole request)"
    if isinstance(recorded, dict) and isinstance(asked, dict):
        return _object_difference(recorded, asked, path)
    if isinstance(recorded, list) and isinstance(asked, list):
        for i, (a, b) in enumerate(zip(recorded, asked, strict=False)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(recorded) != len(asked):
            return f"{here}: recorded {len(recorded)} items, asked {len(asked)}"
        return None
    if recorded != asked or type(recorded) is not type(asked):
        return f"{here}: recorded {_show(recorded)}, asked {_show(asked)}"
    return None


# --- the file ---------------------------------------------------------------------------------------------


class Recorder:
    """Appends exchanges to one file; thread-safe, numbering each kind's exchanges from 1."""

    def __init__(self, path: Path | str, *, secrets: Iterable[str] = ()) -> None:
        self.path = Path(path).expanduser()
        self._extra = list(secrets)
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}

    def write(self, kind: ExchangeKind, **fields: Any) -> None:
        with self._lock:
            seq = self._seq[kind] = self._seq.get(kind, 0) + 1
            exchange = Exchange(kind=kind, seq=seq, **fields)
            line = redact(exchange.model_dump_json(), secret_values(self._extra))
            append_line(self.path, line.encode("utf-8"))


def read_recording(path: Path | str, kind: ExchangeKind) -> list[Exchange]:
    """The exchanges of ``kind`` in a recording, in order; a damaged line is a one-line UsageError."""
    path = Path(path).expanduser()
    raw = read_user_file(path, limit=MAX_RECORDING_BYTES, what="recording")
    out: list[Exchange] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            exchange = Exchange.model_validate(decode_json(line, what=f"{path}:{number}"))
        except ValidationError as exc:
            raise UsageError(f"{path}:{number}: not a recorded exchange: {exc.errors()[0]['msg']}") from None
        if exchange.kind == kind:
            out.append(exchange)
    return out


def _usage(program: GeneratedProgram) -> dict[str, int]:
    pairs = (("input_tokens", program.input_tokens), ("output_tokens", program.output_tokens))
    return {k: v for k, v in pairs if v is not None}


class _Recorded:
    """What both recording wrappers share: the inner provider's name and model, and one exchange written per
    call, its answer or its typed error."""

    kind: ExchangeKind

    def __init__(self, inner: Any, path: Path | str, secrets: Iterable[str]) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.model: str | None = getattr(inner, "model", None)
        self.recorder = Recorder(path, secrets=secrets)

    def _exchange(self, request: BaseModel, call: Any, answer: Any, failure: Any) -> Any:
        """``call()``'s result, written with ``answer(result)`` (response, usage); an exception ``failure`` maps
        to a RecordedError is written too, and raised again."""
        started, t0 = datetime.now(UTC), time.monotonic()
        fields = {"provider": self.name, "model": self.model, "started_at": started,
                  "request": request.model_dump(mode="json")}  # fmt: skip
        try:
            result = call()
        except (ProviderError, ChatProviderError) as exc:
            self.recorder.write(self.kind, **fields, duration_s=time.monotonic() - t0, error=failure(exc))
            raise
        response, usage = answer(result)
        self.recorder.write(self.kind, **fields, duration_s=time.monotonic() - t0, response=response, usage=usage)
        return result


class _Replayed:
    """What both replay providers share: the recording's exchanges of one kind, served in order, each only to
    the question it was recorded with."""

    name = "replay"
    kind: ExchangeKind

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.exchanges = read_recording(self.path, self.kind)
        self.model = self.exchanges[0].model if self.exchanges else None
        self._next = 0
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return len(self.exchanges) - self._next

    def _take(self, request: BaseModel, asking: str) -> Exchange:
        """The next exchange, when it was recorded for ``request``; else the mismatch, naming what differs."""
        asked = request.model_dump(mode="json")
        with self._lock:
            if self._next >= len(self.exchanges):
                self._mismatch(f"replay {self.path.name}: {asking} after the last of the {len(self.exchanges)} "
                               f"recorded {self.kind} exchanges")  # fmt: skip
            exchange = self.exchanges[self._next]
            difference = first_difference(exchange.request, asked)
            if difference:
                self._mismatch(f"replay {self.path.name}: {self.kind} exchange {exchange.seq} differs at {difference}")
            self._next += 1
        return exchange

    def _mismatch(self, message: str) -> NoReturn:
        raise NotImplementedError


# --- program providers ------------------------------------------------------------------------------------


class RecordingProvider(_Recorded):
    """A live provider whose every generation is also written to ``path``."""

    kind: ExchangeKind = "program"

    def __init__(self, inner: Provider, path: Path | str, *, secrets: Iterable[str] = ()) -> None:
        super().__init__(inner, path, secrets)

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        program: GeneratedProgram = self._exchange(
            request, lambda: self.inner.generate(request), lambda p: (p.model_dump(mode="json"), _usage(p)),
            lambda e: RecordedError(error_type=e.error_type, kind=e.kind, message=e.message, retriable=e.retriable),
        )  # fmt: skip
        return program


class ReplayProvider(_Replayed):
    """Serves a recording's program exchanges in order; :class:`ReplayMismatch` on the first divergence."""

    kind: ExchangeKind = "program"

    def _mismatch(self, message: str) -> NoReturn:
        raise ReplayMismatch(message)

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        exchange = self._take(request, f"the runtime asked for {request.role}.{request.method}")
        if exchange.error is not None:
            e = exchange.error
            if e.error_type == InvalidProviderOutput.error_type:
                raise InvalidProviderOutput(e.message, kind=e.kind)
            raise ProviderError(e.message, retriable=e.retriable, kind=e.kind)
        return GeneratedProgram.model_validate(exchange.response)


# --- chat providers ---------------------------------------------------------------------------------------


class RecordingChatProvider(_Recorded):
    """A live chat provider whose every answer is also written to ``path``."""

    kind: ExchangeKind = "chat"

    def __init__(self, inner: ChatProvider, path: Path | str, *, secrets: Iterable[str] = ()) -> None:
        super().__init__(inner, path, secrets)

    def complete(self, request: ChatRequest) -> ChatResponse:
        response: ChatResponse = self._exchange(
            request, lambda: self.inner.complete(request), lambda r: (r.model_dump(mode="json"), dict(r.usage)),
            lambda e: RecordedError(error_type="chat_provider", kind="api_error", message=e.message,
                                    retriable=e.retriable),
        )  # fmt: skip
        return response


class ReplayChatProvider(_Replayed):
    """Serves a recording's chat exchanges in order; :class:`ReplayChatMismatch` on the first divergence."""

    kind: ExchangeKind = "chat"

    def _mismatch(self, message: str) -> NoReturn:
        raise ReplayChatMismatch(message)

    def complete(self, request: ChatRequest) -> ChatResponse:
        exchange = self._take(request, "the session asked for a model answer")
        if exchange.error is not None:
            raise ChatProviderError(exchange.error.message, retriable=exchange.error.retriable)
        return ChatResponse.model_validate(exchange.response)


# --- comparing what a replay produced ---------------------------------------------------------------------

#: Call-log fields that carry an identity minted per run (uuid4): replaced by their order of first appearance,
#: so the shape (which call is whose parent, which attempt belongs to which call) is still compared.
RUN_IDS = frozenset({"trace_id", "call_id", "parent_call_id", "attempt_id"})
#: Call-log fields that are measurements of this run (clock times, durations, CPU and memory): replaced by a
#: placeholder. A replay decides what the model said, not how long the machine took to run it.
MEASUREMENTS = frozenset({
    "started_at", "timestamp", "duration_s", "duration_ms", "wall_s", "cpu_time_s", "peak_memory_mb",
    "sandbox_duration_s", "total_sandbox_duration_s", "bridge_duration_s", "fetch_duration_s", "env_prepare_ms",
    "env_resolve_ms", "env_install_ms",
})  # fmt: skip


def normalised(value: Any, ids: dict[str, str]) -> Any:
    """A call-log record (or any part of one) with :data:`RUN_IDS` numbered and :data:`MEASUREMENTS` blanked;
    ``ids`` carries the numbering across the records of one log. Two runs of one recording give equal
    results byte for byte (``tests/providers/test_replay.py``)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in MEASUREMENTS and item is not None:
                out[key] = "(measured)"
            elif key in RUN_IDS and isinstance(item, str):
                call, _, attempt = item.partition(".")  # an attempt id is '<call id>.<attempt number>'
                number = ids.setdefault(call, f"id{len(ids) + 1}")
                out[key] = f"{number}.{attempt}" if attempt else number
            else:
                out[key] = normalised(item, ids)
        return out
    if isinstance(value, list):
        return [normalised(item, ids) for item in value]
    return value


def normalised_log(text: str) -> str:
    """A call log's JSON lines, each normalised (:func:`normalised`), as canonical JSON lines."""
    ids: dict[str, str] = {}
    lines = (json.loads(line) for line in text.splitlines() if line.strip())
    return "".join(json.dumps(normalised(record, ids), sort_keys=True) + "\n" for record in lines)
