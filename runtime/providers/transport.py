"""What every model transport shares: one failure shape, one status map, one reading of the program payload.

sandforge has one prompt (``prompt.render_prompt``) and one program contract, and several transports that carry
them (the Anthropic Messages API, the OpenAI chat-completions protocol). Each transport turns its SDK's
exceptions into an :class:`ApiFailure` (``status_failure`` decides the lane of an HTTP status for all of them)
(one table per SDK, :class:`SdkErrors`, read by one function, :func:`classify`, at one edge, :func:`mapped`)
and hands the forced tool call's arguments to :func:`program_from_payload`, so a program is read, refused and
accounted for the same way whichever model wrote it. No SDK is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.providers.base import GeneratedProgram, InvalidProviderOutput, ProviderError

#: HTTP statuses worth retrying later (the SDK already retried them ``max_retries`` times).
RETRIABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_ERROR_CHARS = 500


def bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass(frozen=True)
class ApiFailure:
    """One SDK failure, classified: ``kind`` names the mechanism, ``invalid_output`` means the API answered
    with something the SDK could not read (the provider's output is unusable, not the service)."""

    message: str
    retriable: bool
    kind: str
    invalid_output: bool = False


def status_failure(status: int, detail: str) -> ApiFailure:
    """The lane of an HTTP error status, the same for every API: bad credentials and refused requests are
    final, rate limits and server errors may work later."""
    detail = bounded(detail)
    if status in (401, 403):
        return ApiFailure(detail, retriable=False, kind="authentication")
    if status == 429:
        return ApiFailure(detail, retriable=True, kind="rate_limit")
    if status in RETRIABLE_STATUSES or status >= 500:
        return ApiFailure(detail, retriable=True, kind="server_error")
    return ApiFailure(detail, retriable=False, kind="bad_request")


def malformed(api: str) -> ApiFailure:
    """The API answered with a body that is not JSON (a proxy's error page, a cut connection): the SDKs raise
    ``json.JSONDecodeError`` for it, not an error of their own."""
    return ApiFailure(f"the {api} API answered with a body that is not JSON", retriable=True, kind="invalid_payload",
                      invalid_output=True)  # fmt: skip


@dataclass(frozen=True)
class SdkErrors:
    """One SDK's exception classes, a row per mechanism in the order they are tested (a subclass before its
    base: the SDKs derive the timeout from the connection error and both from ``api_error``). The two SDKs
    have the same hierarchy under different names, so one table each and one :func:`classify` serve both."""

    api: str  # names the API in every message: "Anthropic", "OpenAI-compatible"
    sdk: str  # the SDK's module, for a client-side failure: "anthropic", "openai"
    base: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]
    status: type[Exception]
    invalid_response: type[Exception]
    api_error: type[Exception]


def classify(exc: BaseException, errors: SdkErrors) -> ApiFailure:
    """The one exception map (messages bounded, never a request body or a key)."""
    api = errors.api
    if isinstance(exc, errors.timeout):
        return ApiFailure(f"the {api} API timed out", retriable=True, kind="timeout")
    if isinstance(exc, errors.connection):
        return ApiFailure(bounded(f"cannot reach the {api} API: {exc}"), retriable=True, kind="connection")
    if isinstance(exc, errors.status):
        status: int = getattr(exc, "status_code", 0)
        detail = body_message(getattr(exc, "body", None), getattr(exc, "message", str(exc)))
        return status_failure(status, f"{api} API error {status}: {detail}")
    if isinstance(exc, errors.invalid_response):
        message = bounded(f"unexpected response from the {api} API: {exc}")
        return ApiFailure(message, retriable=True, kind="invalid_payload", invalid_output=True)
    if isinstance(exc, errors.api_error):
        return ApiFailure(bounded(f"{api} API error: {exc}"), retriable=True, kind="api_error")
    return ApiFailure(bounded(f"{errors.sdk} client error: {exc}"), retriable=False, kind="client")


@contextmanager
def mapped(errors: SdkErrors, into: Callable[[ApiFailure], Exception]) -> Iterator[None]:
    """The edge where an SDK call's failures become the caller's typed error (``into``: the program providers'
    :func:`error_for`, the chat providers' ``ChatProviderError``): the SDK's own errors through :func:`classify`,
    and ``ValueError``, which the SDKs let through for a body that is not JSON (``json.JSONDecodeError``)."""
    try:
        yield
    except errors.base as exc:
        raise into(classify(exc, errors)) from exc
    except ValueError as exc:
        raise into(malformed(errors.api)) from exc


def error_for(failure: ApiFailure) -> ProviderError:
    """The typed provider error the lifecycle sorts into a lane (``InvalidProviderOutput``: the generation lane)."""
    if failure.invalid_output:
        return InvalidProviderOutput(failure.message, kind=failure.kind)
    return ProviderError(failure.message, retriable=failure.retriable, kind=failure.kind)


def body_message(body: object, fallback: str) -> str:
    """The API's own error message (``{"error": {"message": ...}}``, both APIs' shape), else ``fallback``."""
    if isinstance(body, dict):
        err = body.get("error", body)  # the OpenAI SDK hands over the error object itself
        if isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]:
            return str(err["message"])
    return fallback


def program_from_payload(
    payload: Any, *, truncated: bool, provider: str, model: str, input_tokens: int | None, output_tokens: int | None
) -> GeneratedProgram:
    """The program in a forced tool call's arguments (``{code, dependencies?}``), or InvalidProviderOutput."""
    if not isinstance(payload, dict):
        raise InvalidProviderOutput("the tool call input is not an object", kind="invalid_payload")
    code = payload.get("code")
    if not isinstance(code, str) or not code.strip():
        raise InvalidProviderOutput("the tool call has no 'code' string", kind="invalid_payload")
    if truncated:
        raise InvalidProviderOutput("the program was cut off at max_tokens", kind="truncated")
    deps = payload.get("dependencies", [])
    if deps is None:
        deps = []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise InvalidProviderOutput("'dependencies' must be a list of strings", kind="invalid_payload")
    return GeneratedProgram(
        code=code, dependencies=deps, provider=provider, model=model, input_tokens=input_tokens,
        output_tokens=output_tokens,
    )  # fmt: skip


def effective_timeout(timeout_s: float, time_budget_s: float | None) -> float | None:
    """The call's remaining time when it is shorter than the configured timeout (docs/security.md, "Trace
    budget"): then one attempt only, no SDK retries. None: the configured timeout and retries apply."""
    if time_budget_s is not None and time_budget_s < timeout_s:
        return time_budget_s
    return None
