"""The protections a sandbox can have, the set every backend requires by default, and the refusal.

Fail closed: a sandbox whose host-verified protections lack one that is required is never used. The
default required set is the documented wall (``docs/security.md``): every namespace, the private root,
seccomp, ``no_new_privs``, rlimits and a non-root, capability-free user. Running with less is a deployment
choice that must be stated (``SandboxConfig.allow_missing``, ``SANDFORGE_ALLOW_MISSING_PROTECTIONS``); what
it gives up is shown by ``sandforge doctor`` and in every outcome's ``metadata["protections_waived"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from sandforge.sandbox.backends.base import SandboxUnavailable

Protection = Literal[
    # the walls every backend provides (the default required set)
    "rlimits", "seccomp", "no_new_privs", "unprivileged_user", "private_root", "net_namespace",
    "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace",
    # subprocess backend without root: the namespaces above are owned by a user namespace of its own
    "user_namespace",
    # containers (docker, gvisor, runc, runsc)
    "network_none", "read_only_rootfs", "tmpfs_limited", "capabilities_dropped", "memory_limit", "no_swap",
    "pids_limit", "cpu_limit", "gvisor",
]  # fmt: skip

PROTECTIONS: tuple[Protection, ...] = get_args(Protection)

#: What the documentation promises for every backend; required unless a deployment explicitly waives some.
DEFAULT_REQUIRED: tuple[Protection, ...] = (
    "rlimits", "seccomp", "no_new_privs", "unprivileged_user", "private_root", "net_namespace",
    "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace",
)  # fmt: skip

#: Environment variables: the exact required set (kept for compatibility), and the explicit waiver list.
REQUIRE_ENV = "SANDFORGE_REQUIRE_PROTECTIONS"
ALLOW_MISSING_ENV = "SANDFORGE_ALLOW_MISSING_PROTECTIONS"


def parse_list(text: str, source: str) -> tuple[Protection, ...]:
    """Comma-separated protection names (``none`` or empty: no names); an unknown name is a ValueError."""
    names: list[Protection] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name or name == "none":
            continue
        if name == "all":
            names.extend(DEFAULT_REQUIRED)
            continue
        if name not in PROTECTIONS:
            raise ValueError(f"{source}: unknown protection {name!r} (known: {', '.join(PROTECTIONS)})")
        names.append(name)
    return tuple(dict.fromkeys(names))


def enforced(required: Iterable[Protection], allow_missing: Iterable[Protection]) -> tuple[Protection, ...]:
    """The protections a sandbox must show: the required ones minus the explicitly waived ones."""
    waived = set(allow_missing)
    return tuple(p for p in dict.fromkeys(required) if p not in waived)


def waived(required: Iterable[Protection], allow_missing: Iterable[Protection]) -> tuple[Protection, ...]:
    """What a configuration gives up: documented protections it does not require, plus any it waives."""
    must = set(enforced(required, allow_missing))
    return tuple(p for p in dict.fromkeys((*DEFAULT_REQUIRED, *allow_missing)) if p not in must)


class MissingProtections(SandboxUnavailable):
    """A sandbox lacked required protections: it was destroyed unused. Never retriable on this machine."""

    def __init__(
        self,
        backend: str,
        missing: tuple[Protection, ...],
        reasons: Iterable[str],
        verified: Mapping[str, bool] | None = None,
    ) -> None:
        self.backend = backend
        self.missing = missing
        self.reasons = tuple(reasons)
        self.verified = dict(verified or {})
        why = "; ".join(self.reasons) or "not verified from the host"
        super().__init__(
            f"{backend} sandbox refused: required protections missing: {', '.join(missing)} ({why}); "
            f"run `sandforge doctor`, or waive them explicitly with {ALLOW_MISSING_ENV}={','.join(missing)}",
            retriable=False,
        )


def require(backend: str, verified: Mapping[str, bool], must: Iterable[Protection], reasons: Iterable[str]) -> None:
    """Raise MissingProtections unless every protection in ``must`` was verified active."""
    missing = tuple(p for p in must if not verified.get(p))
    if missing:
        raise MissingProtections(backend, missing, reasons, verified)
