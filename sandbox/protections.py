"""The protections a sandbox can have, the set every backend requires by default, and the refusal.

Fail closed: a sandbox whose host-verified protections lack one that is required is never used. The
default required set is the documented wall (``docs/security.md``): every namespace, the private root,
seccomp, ``no_new_privs``, rlimits and a non-root, capability-free user. Running with less is a deployment
choice that must be stated (``SandboxConfig.allow_missing``, ``SANDFORGE_ALLOW_MISSING_PROTECTIONS``); what
it gives up is shown by ``sandforge doctor`` and in every outcome's ``metadata["protections_waived"]``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from enum import StrEnum

from sandforge.sandbox.errors import SandboxUnavailable


class Protection(StrEnum):
    """One wall a sandbox can have. A member is its name as a string (configuration, outcomes, doctor), so a
    misspelt one is an error where it is written, not a protection that reads as missing."""

    # the walls every backend provides (the default required set)
    RLIMITS = "rlimits"
    SECCOMP = "seccomp"
    NO_NEW_PRIVS = "no_new_privs"
    UNPRIVILEGED_USER = "unprivileged_user"
    PRIVATE_ROOT = "private_root"
    NET_NAMESPACE = "net_namespace"
    MOUNT_NAMESPACE = "mount_namespace"
    IPC_NAMESPACE = "ipc_namespace"
    UTS_NAMESPACE = "uts_namespace"
    PID_NAMESPACE = "pid_namespace"
    # subprocess backend without root: the namespaces above are owned by a user namespace of its own
    USER_NAMESPACE = "user_namespace"
    # containers (docker, gvisor, runc, runsc)
    NETWORK_NONE = "network_none"
    READ_ONLY_ROOTFS = "read_only_rootfs"
    TMPFS_LIMITED = "tmpfs_limited"
    CAPABILITIES_DROPPED = "capabilities_dropped"
    MEMORY_LIMIT = "memory_limit"
    NO_SWAP = "no_swap"
    PIDS_LIMIT = "pids_limit"
    CPU_LIMIT = "cpu_limit"
    GVISOR = "gvisor"
    # every backend: the runner's PEP 578 audit hook, self-tested at start (docs/security.md, "The tripwire")
    AUDIT_TRIPWIRE = "audit_tripwire"


P = Protection

#: Required on every backend whatever the configuration says: it cannot be waived (only the tests' and the
#: benchmark's seam, ``sandbox/seam.py``, starts runners without it).
ALWAYS_REQUIRED: tuple[Protection, ...] = (P.AUDIT_TRIPWIRE,)

PROTECTIONS: tuple[Protection, ...] = tuple(Protection)

#: What the documentation promises for every backend; required unless a deployment explicitly waives some.
DEFAULT_REQUIRED: tuple[Protection, ...] = (
    P.RLIMITS, P.SECCOMP, P.NO_NEW_PRIVS, P.UNPRIVILEGED_USER, P.PRIVATE_ROOT, P.NET_NAMESPACE,
    P.MOUNT_NAMESPACE, P.IPC_NAMESPACE, P.UTS_NAMESPACE, P.PID_NAMESPACE,
)  # fmt: skip

# --- what each backend provides: every one is reported (verified or not) in each worker's protections ---

#: The subprocess backend (rootless, it also reports ``USER_NAMESPACE``: see ``ROOTLESS_PROTECTIONS``).
SUBPROCESS_PROTECTIONS: tuple[Protection, ...] = (*DEFAULT_REQUIRED, P.AUDIT_TRIPWIRE)
ROOTLESS_PROTECTIONS: tuple[Protection, ...] = (P.USER_NAMESPACE,)
#: Every container backend (docker, gvisor, runc, runsc), in the order outcomes list them.
CONTAINER_PROTECTIONS: tuple[Protection, ...] = (
    P.NETWORK_NONE, P.READ_ONLY_ROOTFS, P.TMPFS_LIMITED, P.CAPABILITIES_DROPPED, P.NO_NEW_PRIVS,
    P.UNPRIVILEGED_USER, P.MEMORY_LIMIT, P.NO_SWAP, P.PIDS_LIMIT, P.CPU_LIMIT, P.SECCOMP, P.RLIMITS,
    P.PRIVATE_ROOT, P.NET_NAMESPACE, P.MOUNT_NAMESPACE, P.IPC_NAMESPACE, P.UTS_NAMESPACE, P.PID_NAMESPACE,
    P.AUDIT_TRIPWIRE,
)  # fmt: skip
#: Containers on gVisor's kernel (gvisor through dockerd, runsc directly).
GVISOR_PROTECTIONS: tuple[Protection, ...] = (*CONTAINER_PROTECTIONS, P.GVISOR)

PROVIDED: Mapping[str, tuple[Protection, ...]] = {
    "subprocess": SUBPROCESS_PROTECTIONS,
    "docker": CONTAINER_PROTECTIONS,
    "gvisor": GVISOR_PROTECTIONS,
    "runc": CONTAINER_PROTECTIONS,
    "runsc": GVISOR_PROTECTIONS,
}


def unverified(backend: str) -> dict[str, bool]:
    """Every protection ``backend`` provides, none verified yet: what its host checks then fill in."""
    return dict.fromkeys(PROVIDED[backend], False)


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
        names.append(Protection(name))
    return tuple(dict.fromkeys(names))


def enforced(required: Iterable[Protection], allow_missing: Iterable[Protection]) -> tuple[Protection, ...]:
    """The protections a sandbox must show: the required ones minus the explicitly waived ones, plus
    ``ALWAYS_REQUIRED``, which no waiver removes."""
    from sandforge.sandbox import seam

    return _enforced(tuple(required), tuple(allow_missing), seam.tripwire_off())


@functools.lru_cache(maxsize=64)
def _enforced(
    required: tuple[Protection, ...], allow_missing: tuple[Protection, ...], tripwire_off: bool
) -> tuple[Protection, ...]:
    """``enforced``, computed once per configuration (it is asked on every execution and every worker's start)."""
    waived = set(allow_missing)
    always = () if tripwire_off else ALWAYS_REQUIRED
    return tuple(p for p in dict.fromkeys((*required, *always)) if p not in waived or p in always)


def waived(required: Iterable[Protection], allow_missing: Iterable[Protection]) -> tuple[Protection, ...]:
    """What a configuration gives up: documented protections it does not require, plus any it waives."""
    from sandforge.sandbox import seam

    return _waived(tuple(required), tuple(allow_missing), seam.tripwire_off())


@functools.lru_cache(maxsize=64)
def _waived(
    required: tuple[Protection, ...], allow_missing: tuple[Protection, ...], tripwire_off: bool
) -> tuple[Protection, ...]:
    must = set(_enforced(required, allow_missing, tripwire_off))
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
