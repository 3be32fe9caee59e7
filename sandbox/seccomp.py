"""Compile the sandbox's seccomp filter on the host with libseccomp (via pyseccomp).

The runner only loads the resulting classic-BPF bytes with ``prctl``, so it stays standard-library-only.
Policy: allow by default, fail with EPERM the system calls a tool program never needs and an attacker
would: networking, process creation and signalling, mounting and namespace changes, kernel interfaces.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile

log = logging.getLogger(__name__)

DENIED_SYSCALLS: tuple[str, ...] = (
    # network
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # process creation, execution, signalling, tracing
    "fork", "vfork", "clone", "execve", "execveat", "kill", "tkill", "tgkill", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "ptrace",
    "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal", "pidfd_getfd",
    # file systems, namespaces, identity
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree", "fsopen",
    "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at", "mknod", "mknodat",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "capset",
    # kernel interfaces
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "settimeofday", "clock_settime", "adjtimex", "syslog", "personality", "quotactl", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "iopl", "ioperm", "modify_ldt",
)  # fmt: skip

#: clone3 must fail with ENOSYS (not EPERM) so libc falls back to clone, which is then denied.
ENOSYS_SYSCALLS: tuple[str, ...] = ("clone3",)


#: What a confined environment zygote may do beyond a sandbox (``sandbox/inside/confine.py``): what its runners
#: need (``clone`` into namespaces of their own, never with CLONE_THREAD: no thread) and their own lock-down
#: (their root's mounts, ``chroot``, dropping the capabilities their user namespace grants). Not ``unshare``:
#: the zygote's own namespaces stay as it made them.
ZYGOTE_ALLOWED: tuple[str, ...] = ("clone", "mount", "chroot", "capset")
CLONE_THREAD = 0x00010000


@functools.cache
def compiled_filter() -> bytes | None:
    """The filter as BPF bytes, or None when libseccomp is unavailable on this machine."""
    return _compile(DENIED_SYSCALLS, zygote=False)


@functools.cache
def zygote_filter() -> bytes | None:
    """The confined environment zygote's filter: the sandbox's, minus ``ZYGOTE_ALLOWED`` (None: no libseccomp).
    Its runners stack the sandbox's own on it."""
    return _compile(tuple(n for n in DENIED_SYSCALLS if n not in ZYGOTE_ALLOWED), zygote=True)


def _compile(denied: tuple[str, ...], *, zygote: bool) -> bytes | None:
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # pragma: no cover - depends on the machine
        log.warning("seccomp unavailable: %s", exc)
        return None
    flt = sc.SyscallFilter(sc.ALLOW)
    for name, err in [(n, errno.EPERM) for n in denied] + [(n, errno.ENOSYS) for n in ENOSYS_SYSCALLS]:
        try:
            flt.add_rule(sc.ERRNO(err), name)
        except (ValueError, RuntimeError, OSError):
            log.debug("syscall %s does not exist on this architecture", name)
    if zygote:
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, CLONE_THREAD))
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()
