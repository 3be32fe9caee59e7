"""``POST /v1/exec``: the route and its fast path.

The route is declared on the FastAPI app (its OpenAPI entry, and the answer for any caller that reaches the
app itself), but the gatekeeper answers it directly (:class:`ExecFastPath`): the body it already read is
validated by the request model in one call, the outcome is encoded and scrubbed in one pass, and the
execution is awaited on the loop (``AsyncSandbox``: no thread hop each way, no thread waiting for the
worker's output; planned on a thread only when validating or preparing an environment would block the
loop). That skips FastAPI's per-request dependency solving, a second JSON encoding, a value walk and two
thread wake-ups, which were most of the HTTP overhead (docs/serve.md, "Speed"). Both paths share
:func:`run_exec`, so their answers are the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandforge.runtime.agent.egress import StandaloneBridge
from sandforge.runtime.agent.program_exec import execute_program_async
from sandforge.runtime.agent.runs import RunClock, run_record
from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.transfer import manifest
from sandforge.runtime.service.deps import ApiError, Service, first_error
from sandforge.runtime.service.gate import Receive, Scope, body_chunks, header_value
from sandforge.runtime.service.models import ExecRequest, exec_result
from sandforge.runtime.service.receiving import FORM, Bounds, content_kind, receive_body
from sandforge.runtime.service.spool import TooLarge
from sandforge.runtime.service.tenants import TenantRuntime
from sandforge.runtime.service.uploads import BadReference
from sandforge.sandbox import ExecutionOutcome, ExecutionRequest

log = logging.getLogger(__name__)
#: outputs up to this size are inlined in the answer as well as kept (above it: the download URL only)
INLINE_MAX = 64 << 10

#: (status, body, extra headers) of a direct answer
Answer = tuple[int, bytes, dict[str, str]]
#: the multipart form as OpenAPI says it (answered by :meth:`ExecFastPath.multipart`)
MULTIPART_BODY: dict[str, Any] = {"requestBody": {"content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["request"],
    "properties": {"request": {"type": "string", "description": "the JSON body (ExecRequest)"}},
    "additionalProperties": {"type": "string", "format": "binary", "description": "an input file, by filename"},
}}}}}  # fmt: skip
_NOT_A_FORM = ("body: a multipart POST /v1/exec is a form with a 'request' field (the JSON body) and a file part "
               "for each input file")  # fmt: skip


def check_limits(rt: TenantRuntime, body: ExecRequest) -> None:
    quotas = rt.config.quotas
    if body.timeout_s is not None and body.timeout_s > quotas.max_timeout_s:
        raise ApiError(422, "limit_exceeded", f"timeout_s is over this tenant's maximum ({quotas.max_timeout_s:g} s)")
    if body.memory_mb is not None and body.memory_mb > quotas.max_memory_mb:
        raise ApiError(422, "limit_exceeded", f"memory_mb is over this tenant's maximum ({quotas.max_memory_mb} MB)")


async def run_exec(
    service: Service, rt: TenantRuntime, body: ExecRequest, spooled: Mapping[str, Path] | None = None
) -> ExecutionOutcome:
    """One program: validated by the tenant's policy, run in a fresh sandbox (``sandforge exec --json``).
    ``spooled``: input files a multipart request streamed to disk (name -> its spool), read when the request
    is built, like a CLI ``--file``."""
    check_limits(rt, body)
    try:
        limits = rt.limits(timeout_s=body.timeout_s, memory_mb=body.memory_mb)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", first_error(exc)) from None
    files: dict[str, bytes | Path] = dict(body.files)
    for name, path in (spooled or {}).items():
        if name in body.files or name in body.file_refs:
            raise ApiError(422, "invalid_request", f"{name}: this input file is given twice")
        files[name] = path
    if body.file_refs:
        try:
            files.update(await service.blocking(lambda: rt.uploads.referenced(body.file_refs, body.files, limits)))
        except BadReference as exc:  # another tenant's file included: not found, as a made-up one
            raise ApiError(422, "invalid_request", str(exc)) from None
    try:
        req = ExecutionRequest(code=body.code, context=body.context, args=body.args, kwargs=body.kwargs,
                               limits=limits, files=files)  # fmt: skip
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", first_error(exc)) from None
    policy, sandbox, environments = rt.policy, rt.async_sandbox, rt.environments

    async def run() -> ExecutionOutcome:
        bridge = StandaloneBridge.of(policy)  # fetches brokered under the tenant's egress rules, as exec does
        clock = RunClock()
        outcome, verdict = await execute_program_async(sandbox, req, policy=policy, backend=body.backend,
                                                       bridge=bridge, environments=environments)  # fmt: skip
        outcome = bridge.fetches.attach(outcome)
        # into the tenant's call log, failed or not (issue 37): one short append, as an agent call's record
        rt.call_log.append(run_record(outcome, verdict, req, source="http", clock=clock))
        return outcome

    return await service.execute_async(rt, run)


def keep_outputs(rt: TenantRuntime, outcome: ExecutionOutcome) -> list[dict[str, Any]]:
    """An ok run's outputs as the answer lists them: each kept in the tenant's store (an id and a download
    URL), inlined up to ``INLINE_MAX``. Over the store's quota they are not kept and all are inlined: the run
    committed them, so they reach the caller either way."""
    listed = manifest(outcome.files, content=True)
    try:
        kept = rt.uploads.put_all(outcome.files.items(), kind="output")
    except SandforgeError as exc:  # over the quota (StoreFull), or the disk refused
        log.info("outputs not kept: %s", exc)
        return [{**item, "id": None, "url": None} for item in listed]
    for item, record in zip(listed, kept, strict=True):
        item.update(id=record.id, url=record.url)
        if record.size > INLINE_MAX:
            item["content_b64"] = None
    return listed


async def http_result(service: Service, rt: TenantRuntime, outcome: ExecutionOutcome) -> dict[str, Any]:
    """``exec_result`` with the outputs kept (:func:`keep_outputs`): what ``POST /v1/exec`` answers."""
    result = exec_result(outcome)
    if outcome.files:
        result["files"] = await service.blocking(lambda: keep_outputs(rt, outcome))
    return result


def outcome_word(outcome: ExecutionOutcome) -> str:
    """What the audit record says of an execution: ok, or its error type."""
    return "ok" if outcome.ok else (outcome.error_type.value if outcome.error_type else "error")


def _body_error(exc: ValidationError) -> str:
    """The first problem, located as FastAPI locates body errors (``body.<field>``)."""
    errors = exc.errors()
    err = errors[0]
    where = ".".join(["body", *(str(p) for p in err.get("loc", ()))])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {err.get('msg', 'invalid')}{more}"


class ExecFastPath:
    """The gatekeeper's direct answer to ``POST /v1/exec`` (see the module docstring)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def _error(self, state: dict[str, Any], exc: ApiError) -> Answer:
        state["outcome"] = exc.error_type
        body = {"error": {"type": exc.error_type, "message": " ".join(exc.message.split())}}
        return exc.status, self.service.scrub.json_bytes(body), exc.headers

    async def __call__(self, rt: TenantRuntime, raw: bytes, state: dict[str, Any]) -> Answer:
        return await self._answer(rt, state, raw, {})

    async def multipart(self, rt: TenantRuntime, scope: Scope, receive: Receive, state: dict[str, Any]) -> Answer:
        """A multipart ``POST /v1/exec``: the ``request`` field (the JSON body) and file parts (each an input
        file named by its filename), the files streamed to disk as they arrive, bounded by the tenant's
        ``Limits`` (count, each, in all: 413 at the first chunk past one), removed once the run is over."""
        content_type = header_value(scope, b"content-type").decode("latin-1")
        if content_kind(content_type) != FORM:
            return self._error(state, ApiError(422, "invalid_request", _NOT_A_FORM))
        limits, store = rt.limits(), rt.uploads
        bounds = Bounds(max_files=limits.max_files, files_bytes=limits.max_files_bytes,
                        field_bytes=rt.config.quotas.max_body_bytes)  # fmt: skip
        try:
            received = await receive_body(content_type, None, body_chunks(receive),
                                          lambda name: store.spool(name, limits.max_file_bytes), bounds)  # fmt: skip
        except TooLarge as exc:
            return self._error(state, ApiError(413, "body_too_large", f"input files refused: {exc}"))
        except ApiError as exc:
            return self._error(state, exc)
        try:
            spooled = {spool.name: spool.path for spool in received.files}
            if len(spooled) < len(received.files):
                return self._error(state, ApiError(422, "invalid_request", "an input file name is given twice"))
            if "request" not in received.fields:
                return self._error(state, ApiError(422, "invalid_request", _NOT_A_FORM))
            return await self._answer(rt, state, received.fields["request"], spooled)
        finally:
            received.discard()

    async def _answer(self, rt: TenantRuntime, state: dict[str, Any], raw: bytes, spooled: dict[str, Path]) -> Answer:
        try:
            body = ExecRequest.model_validate_json(raw)
            outcome = await run_exec(self.service, rt, body, spooled)
            result = await http_result(self.service, rt, outcome)
        except ValidationError as exc:
            return self._error(state, ApiError(422, "invalid_request", _body_error(exc)))
        except ApiError as exc:
            return self._error(state, exc)
        except SandforgeError as exc:
            log.warning("request failed: %s", exc)
            return self._error(state, ApiError(503, "unavailable", str(exc)))
        except Exception:
            log.exception("internal error")
            return self._error(state, ApiError(500, "internal_error", "internal error (see the server log)"))
        state["outcome"] = outcome_word(outcome)
        return 200, self.service.scrub.json_bytes(result), {}

    async def stream(self, rt: TenantRuntime, raw: bytes, state: dict[str, Any], send: Any) -> None:
        """The answer as server-sent events (``Accept: text/event-stream``): ``progress`` for each step of a
        first build of the program's environment (``{"step": n, "message": ...}``), then one ``result``:
        ``{"status": <the status the plain answer has>, "body": <its body>}``. Always ``200``: the status of
        the run travels in the last event."""
        from sandforge.runtime.service.progress import hearing, on_loop

        heard: asyncio.Queue[str] = asyncio.Queue()

        async def answer() -> Answer:
            with hearing(on_loop(heard.put)):  # the planning thread runs in a copy of this context
                return await self(rt, raw, state)

        await send({"type": "http.response.start", "status": 200, "headers": EVENT_HEADERS})
        task = asyncio.ensure_future(answer())
        try:
            step = 0
            while not task.done() or not heard.empty():
                waiting = asyncio.ensure_future(heard.get())
                await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    waiting.cancel()
                    continue
                step += 1
                data = self.service.scrub.json_bytes({"step": step, "message": waiting.result()})
                await send({"type": "http.response.body", "body": event(b"progress", data), "more_body": True})
            status, body, _ = task.result()
        finally:
            task.cancel()  # the client went away (this request cancelled): its execution ends with it
        data = b'{"status":%d,"body":%s}' % (status, body)
        await send({"type": "http.response.body", "body": event(b"result", data), "more_body": False})


#: The head of a streamed answer (no caching, no buffering by a proxy).
EVENT_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                 (b"x-accel-buffering", b"no")]  # fmt: skip


def event(name: bytes, data: bytes) -> bytes:
    """One server-sent event (``data`` is compact JSON: one line)."""
    return b"event: " + name + b"\ndata: " + data + b"\n\n"
