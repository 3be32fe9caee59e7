"""Typed failures of preparing an environment (names from the original project's ADR 0010).

Each carries a ``kind`` (the outcome's ``error_type``) and a one-line message; `LIFECYCLE` says how the call
loop treats it (the same three flags as ``runtime.egress.errors.LIFECYCLE``)."""

from __future__ import annotations

from typing import Literal

from sandforge.runtime.errors import SandforgeError

ErrorKind = Literal[
    "invalid_dependency_manifest",
    "dependency_policy_violation",
    "dependency_resolution_failed",
    "dependency_install_failed",
    "environment_preparing",
]


class EnvironmentFailure(SandforgeError):
    """Base of every failure to prepare an environment."""

    kind: ErrorKind = "dependency_install_failed"

    def __init__(self, message: str, *, reason: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason or self.kind


class InvalidDependencyManifest(EnvironmentFailure):
    """The program's manifest is malformed: bad PEP 723 block, an invalid name or specifier, a conflicting
    duplicate, a URL or path requirement. Recoverable: the model gets the message and rewrites it."""

    kind = "invalid_dependency_manifest"
    exit_code = 2


class DependencyPolicyViolation(EnvironmentFailure):
    """A declared or transitive distribution is not allowed (blocked, not in ``allow``, an HTTP client,
    published only as a source distribution) or the environment is over ``max_env_mb``. Recoverable: the
    feedback lists what is allowed. ``names`` are the offending distributions."""

    kind = "dependency_policy_violation"

    def __init__(
        self, message: str, *, names: tuple[str, ...] = (), allowed: tuple[str, ...] = (), reason: str = ""
    ) -> None:
        hint = f"allowed distributions: {', '.join(allowed)}" if allowed else "the policy allows no distribution"
        super().__init__(message, reason=reason, hint=hint)
        self.names = names
        self.allowed = allowed


class DependencyResolutionFailed(EnvironmentFailure):
    """No set of versions satisfies the manifest from the policy's source. Intrinsic to the manifest."""

    kind = "dependency_resolution_failed"


class DependencyInstallFailed(EnvironmentFailure):
    """Installing failed for an extrinsic reason (a download, the disk, uv itself). Retriable."""

    kind = "dependency_install_failed"


class EnvironmentPreparing(EnvironmentFailure):
    """Another process is building the same environment and did not finish within the wait. Retriable."""

    kind = "environment_preparing"


ERRORS: dict[str, type[EnvironmentFailure]] = {
    cls.kind: cls
    for cls in (
        InvalidDependencyManifest,
        DependencyPolicyViolation,
        DependencyResolutionFailed,
        DependencyInstallFailed,
        EnvironmentPreparing,
    )
}

#: (terminal, retriable, counts against the artifact's health), as in ``runtime.egress.errors.LIFECYCLE``.
#: The two recoverable kinds go back to the model with feedback (regeneration), so they are neither terminal
#: nor retriable as they are; a failed resolution is the manifest's own fault; the last two are extrinsic.
LIFECYCLE: dict[str, tuple[bool, bool, bool]] = {
    "invalid_dependency_manifest": (False, False, True),
    "dependency_policy_violation": (False, False, True),
    "dependency_resolution_failed": (False, False, True),
    "dependency_install_failed": (False, True, False),
    "environment_preparing": (False, True, False),
}

#: Kinds whose feedback goes to the model for a new generation (ADR 0010's "recoverable").
RECOVERABLE = frozenset({"invalid_dependency_manifest", "dependency_policy_violation"})
