"""The store's enumerations and the one failure classification of sandforge, in plain Python.

The call log's record (``runtime.agent.calllog``) and the lifecycle's lanes (``runtime.agent.failures``) need
these and nothing else of the store: here they load without the store's models (a dozen pydantic models, the
environment identity and ``packaging``), which ``sandforge exec`` would otherwise build on every run (issue 39).
``runtime.store.models`` and ``runtime.store.health`` re-export them.
"""

from __future__ import annotations

from enum import StrEnum


class FailureClass(StrEnum):
    """Why an execution failed. Only INTRINSIC (a defect of the code) counts toward repair/regeneration.

    EXTRINSIC: the world failed (timeout, sandbox or network unavailable, rate limit); retrying may work.
    ADAPTIVE: the input did not fit (missing input, unparseable data); the code may be fine.
    """

    INTRINSIC = "intrinsic"
    EXTRINSIC = "extrinsic"
    ADAPTIVE = "adaptive"


class ProgramSource(StrEnum):
    """Where the code of a call came from (ADR 0012 section 10). Artifacts are GENERATED or REPAIRED."""

    PERSISTED = "persisted"
    REPAIRED = "repaired"
    GENERATED = "generated"


# The one failure classification of sandforge: the lifecycle's lanes (``runtime.agent.failures``) and artifact
# health (``runtime.store.health``) both use it, so a call's lane and its artifact's health agree.

#: Error types (the sandbox's ``ErrorType`` values and common ``Outcome.error`` types) that are the
#: world's fault, not the code's: retrying later may work.
EXTRINSIC_ERROR_TYPES: frozenset[str] = frozenset(
    {
        "timeout",
        "sandbox_unavailable",
        "network_error",
        "connection_error",
        "provider",
        "rate_limit",
        "rate_limited",
        "provider_error",
        "service_unavailable",
        "dependency_unavailable",
        "dependency_install_failed",  # issue 19: a download, the disk, uv itself
        "environment_preparing",  # another process still building the same environment
    }
)
#: Error types that say the *input* did not fit: the code may be right for other inputs.
ADAPTIVE_ERROR_TYPES: frozenset[str] = frozenset(
    {"parse_error", "missing_input", "invalid_input", "invalid_format", "schema_mismatch", "not_found"}
)


def classify_failure(error_type: str | None) -> FailureClass:
    """Default classification of an error type; anything unknown is the code's fault (INTRINSIC)."""
    key = (error_type or "").strip().lower()
    if key in EXTRINSIC_ERROR_TYPES:
        return FailureClass.EXTRINSIC
    if key in ADAPTIVE_ERROR_TYPES:
        return FailureClass.ADAPTIVE
    return FailureClass.INTRINSIC


def classify_outcome(error_type: str | None, *, tool_error: bool, retriable: bool) -> FailureClass:
    """The class of a failed call, the same in the outcome's metadata, the call log and the store.

    A program's own ``Outcome.error`` (``tool_error``) is never extrinsic: only what the host observed (its
    own timeout, a sandbox that did not start, the provider failing) is the world's fault, and a program
    saying ``Outcome.error("timeout", ...)`` is a claim, so it is at most ADAPTIVE and a stored program that
    makes it is still repaired. Its non-retriable error is its deliberate answer, not a crash: at worst
    ADAPTIVE too (it still degrades health when it keeps happening, see ``ADAPTIVE_DEGRADED_FAILURES``)."""
    cls = classify_failure(error_type)
    if tool_error and (cls is FailureClass.EXTRINSIC or (not retriable and cls is FailureClass.INTRINSIC)):
        return FailureClass.ADAPTIVE
    return cls
