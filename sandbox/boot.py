"""The boot frame, built in one place: how a runner locks itself down before it may receive code.

Two shapes exist. A subprocess runner raises every wall itself (namespaces, a private root, dropping to
the sandbox user) on top of rlimits, ``no_new_privs`` and the seccomp filter; a container's runner adds
only those three, since the namespaces, root and user are the container's own, and may be given the
container's hand-off directory (``sandbox/handoff.py``).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from sandforge.sandbox import image, seam, seccomp
from sandforge.sandbox.containers import SCRATCH
from sandforge.sandbox.handoff import MOUNT_POINT as HANDOFF_MOUNT_POINT
from sandforge.sandbox.protocol import BootFrame, Limits

if TYPE_CHECKING:
    from sandforge.sandbox.environment import MountedEnvironment
    from sandforge.sandbox.handoff import HandoffDir


def _seccomp_b64() -> str | None:
    """The host-compiled filter (libseccomp), or None where it cannot be compiled here."""
    bpf = seccomp.compiled_filter()
    return base64.b64encode(bpf).decode() if bpf else None


def process_boot(limits: Limits, *, sys_path: list[str], workdir: str | None, uid: int, gid: int) -> BootFrame:
    """A runner that is its own sandbox: as root it drops to ``uid``; rootless, that uid is its id inside its
    user namespace."""
    return BootFrame(
        sys_path=sys_path,
        limits=limits,
        seccomp_bpf_b64=_seccomp_b64(),
        namespaces=True,
        chroot=True,
        workdir=workdir,
        drop_to_uid=uid,
        drop_to_gid=gid,
        seam=seam.ACTIVE,
    )


def container_boot(
    limits: Limits, handed: HandoffDir | None, environment: MountedEnvironment | None = None
) -> BootFrame:
    """A runner inside a container (docker, gvisor, runc, runsc): rlimits, no_new_privs and its own seccomp
    filter (which also denies execve); the hand-off directory, if any, with the token that proves it; the
    environment the container's runtime mounted, if any."""
    return BootFrame(
        sys_path=[image.IMAGE_LIB],
        limits=limits,
        seccomp_bpf_b64=_seccomp_b64(),
        namespaces=False,
        chroot=False,
        workdir=SCRATCH,
        drop_to_uid=None,
        drop_to_gid=None,
        handoff_dir=HANDOFF_MOUNT_POINT if handed else None,
        handoff_token=handed.token if handed else None,
        environment=environment.boot(bind=False) if environment is not None else None,
        seam=seam.ACTIVE,
    )


__all__ = ["container_boot", "process_boot"]
