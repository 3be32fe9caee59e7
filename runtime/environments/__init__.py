"""Third-party packages for generated tools (issue 19): a program's manifest (PEP 723), the policy's
``dependencies:`` section, and environments built on the host with uv, content-addressed and cached, to be
mounted read-only into a sandbox. See docs/environments.md."""

from __future__ import annotations

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
