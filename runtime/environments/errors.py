"""Typed failures of preparing an environment (names from the original project's ADR 0010).

Each carries a ``kind`` (an ``ErrorType`` member: the outcome's ``error_type`` wherever the failure ends, a
``sandforge exec``, the lifecycle, the call log), a one-line message and its `Lane` (how the call loop treats
it). One family with the egress broker's failures: both derive from ``runtime.host_failures.HostFailure``."""

from __future__ import annotations

from typing import ClassVar

from sandforge.runtime.host_failures import HostFailure, Lane, tables
from sandforge.sandbox.protocol import ErrorType

#: The two recoverable kinds go back to the model with feedback (regeneration): neither terminal nor
#: retriable as they are, and they count against the artifact (its manifest is wrong).
_RECOVERABLE = Lane(terminal=False, retriable=False, counts_against_health=True)
#: The world's fault (a download, the disk, another process building it): retriable, never the artifact's.
_EXTRINSIC = Lane(terminal=False, retriable=True, counts_against_health=False)


class EnvironmentFailure(HostFailure):
    """Base of every failure to prepare an environment."""

    kind: ClassVar[ErrorType] = ErrorType.DEPENDENCY_INSTALL_FAILED
    lane: ClassVar[Lane] = _EXTRINSIC


class InvalidDependencyManifest(EnvironmentFailure):
    """The program's manifest is malformed: bad PEP 723 block, an invalid name or specifier, a conflicting
    duplicate, a URL or path requirement. Recoverable: the model gets the message and rewrites it."""

    kind = ErrorType.INVALID_DEPENDENCY_MANIFEST
    lane = _RECOVERABLE
    exit_code = 2


class DependencyPolicyViolation(EnvironmentFailure):
    """A declared or transitive distribution is not allowed (blocked, not in ``allow``, an HTTP client,
    published only as a source distribution) or the environment is over ``max_env_mb``. Recoverable: the
    feedback lists what is allowed. ``names`` are the offending distributions."""

    kind = ErrorType.DEPENDENCY_POLICY_VIOLATION
    lane = _RECOVERABLE

    def __init__(
        self, message: str, *, names: tuple[str, ...] = (), allowed: tuple[str, ...] = (), reason: str = ""
    ) -> None:
        hint = f"allowed distributions: {', '.join(allowed)}" if allowed else "the policy allows no distribution"
        super().__init__(message, reason=reason, hint=hint)
        self.names = names
        self.allowed = allowed


class DependencyResolutionFailed(EnvironmentFailure):
    """No set of versions satisfies the manifest from the policy's source. Intrinsic to the manifest."""

    kind = ErrorType.DEPENDENCY_RESOLUTION_FAILED
    lane = Lane(terminal=False, retriable=False, counts_against_health=True)  # intrinsic: the manifest's fault


class DependencyInstallFailed(EnvironmentFailure):
    """Installing failed for an extrinsic reason (a download, the disk, uv itself). Retriable."""

    kind = ErrorType.DEPENDENCY_INSTALL_FAILED
    lane = _EXTRINSIC


class EnvironmentPreparing(EnvironmentFailure):
    """Another process is building the same environment and did not finish within the wait. Retriable."""

    kind = ErrorType.ENVIRONMENT_PREPARING
    lane = _EXTRINSIC


#: kind -> class, and kind -> (terminal, retriable, counts against the artifact's health).
ERRORS, LIFECYCLE = tables(
    (
        InvalidDependencyManifest,
        DependencyPolicyViolation,
        DependencyResolutionFailed,
        DependencyInstallFailed,
        EnvironmentPreparing,
    )
)

#: Kinds whose feedback goes to the model for a new generation (ADR 0010's "recoverable").
RECOVERABLE = frozenset({ErrorType.INVALID_DEPENDENCY_MANIFEST, ErrorType.DEPENDENCY_POLICY_VIOLATION})
