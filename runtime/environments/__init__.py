"""Third-party packages for generated tools (issue 19): a program's manifest (PEP 723), the policy's
``dependencies:`` section, and environments built on the host with uv, content-addressed and cached, to be
mounted read-only into a sandbox. See docs/environments.md. The names load on first use: the policy loader
imports ``environments.policy`` without the builder (uv, the records, the layout), which only a program that
declares packages needs (issue 39)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.environments.builder import EnvironmentStore
    from sandforge.runtime.environments.errors import (
        ERRORS,
        LIFECYCLE,
        DependencyInstallFailed,
        DependencyPolicyViolation,
        DependencyResolutionFailed,
        EnvironmentFailure,
        EnvironmentPreparing,
        InvalidDependencyManifest,
    )
    from sandforge.runtime.environments.identity import EnvironmentSpec, Pin
    from sandforge.runtime.environments.manifest import Manifest, manifest_of, normalise
    from sandforge.runtime.environments.policy import HTTP_CLIENTS, DependenciesSection, DependencyPolicy, SourcePolicy
    from sandforge.runtime.environments.records import MOUNT_PATH, EnvironmentRecord, PreparedEnvironment
    from sandforge.runtime.environments.target import SandboxTarget, probe

__all__ = [
    "ERRORS",
    "HTTP_CLIENTS",
    "LIFECYCLE",
    "MOUNT_PATH",
    "DependenciesSection",
    "DependencyInstallFailed",
    "DependencyPolicy",
    "DependencyPolicyViolation",
    "DependencyResolutionFailed",
    "EnvironmentFailure",
    "EnvironmentPreparing",
    "EnvironmentRecord",
    "EnvironmentSpec",
    "EnvironmentStore",
    "InvalidDependencyManifest",
    "Manifest",
    "Pin",
    "PreparedEnvironment",
    "SandboxTarget",
    "SourcePolicy",
    "manifest_of",
    "normalise",
    "probe",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "EnvironmentStore": "sandforge.runtime.environments.builder",
        "ERRORS": "sandforge.runtime.environments.errors",
        "LIFECYCLE": "sandforge.runtime.environments.errors",
        "DependencyInstallFailed": "sandforge.runtime.environments.errors",
        "DependencyPolicyViolation": "sandforge.runtime.environments.errors",
        "DependencyResolutionFailed": "sandforge.runtime.environments.errors",
        "EnvironmentFailure": "sandforge.runtime.environments.errors",
        "EnvironmentPreparing": "sandforge.runtime.environments.errors",
        "InvalidDependencyManifest": "sandforge.runtime.environments.errors",
        "EnvironmentSpec": "sandforge.runtime.environments.identity",
        "Pin": "sandforge.runtime.environments.identity",
        "Manifest": "sandforge.runtime.environments.manifest",
        "manifest_of": "sandforge.runtime.environments.manifest",
        "normalise": "sandforge.runtime.environments.manifest",
        "HTTP_CLIENTS": "sandforge.runtime.environments.policy",
        "DependenciesSection": "sandforge.runtime.environments.policy",
        "DependencyPolicy": "sandforge.runtime.environments.policy",
        "SourcePolicy": "sandforge.runtime.environments.policy",
        "MOUNT_PATH": "sandforge.runtime.environments.records",
        "EnvironmentRecord": "sandforge.runtime.environments.records",
        "PreparedEnvironment": "sandforge.runtime.environments.records",
        "SandboxTarget": "sandforge.runtime.environments.target",
        "probe": "sandforge.runtime.environments.target",
    },
)
