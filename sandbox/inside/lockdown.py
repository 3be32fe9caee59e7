"""The lock-down: every wall the boot frame asks for, applied by the process to itself before it may
receive code (namespaces, private tmpfs root, dropped privileges, rlimits, no_new_privs, seccomp).

The host verifies each one from outside (``/proc``) and refuses a worker whose walls are missing; what
this module reports is only a claim.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import os
import resource
import select
import signal
import sys
from typing import Any

from .envmodules import private_root_binds
from .idiom_modules import tz_binds

# Linux constants (x86_64 and aarch64 agree on these).
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_PARENT = 0x10000000, 0x20000000, 0x40000000, 0x00008000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 0x1, 0x20, 0x1000, 0x400, 0x800, 0x200000
#: statvfs flags of a bind's source that a read-only remount must keep (the kernel refuses to clear them
#: in a user namespace), as mount flags.
_KEPT_FLAGS = ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
               (os.ST_RELATIME, MS_RELATIME))  # fmt: skip
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_GET_PDEATHSIG = 2


SECCOMP_MODE_FILTER = 2


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write_file(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


#: Why the runner could not enter its outer user namespace before exec (rootless mode; see ``main``).
USERNS_ERRORS: list[str] = []
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
NAMESPACE_NAMES = ["net_namespace", "mount_namespace", "ipc_namespace", "uts_namespace", "pid_namespace"]


def _map_ids(inner: tuple[int, int], outer: tuple[int, int]) -> None:
    """In a fresh user namespace, map our own (outer) ids to the given inner ones: the one mapping an
    unprivileged process may write. Must run while the process is still dumpable, or /proc/self/*
    belongs to root and the writes fail with EACCES."""
    _write_file("/proc/self/setgroups", "deny")  # required before gid_map without CAP_SETGID outside
    _write_file("/proc/self/uid_map", f"{inner[0]} {outer[0]} 1")
    _write_file("/proc/self/gid_map", f"{inner[1]} {outer[1]} 1")


def _uid_mapped(uid: int) -> bool:
    """Whether ``uid`` exists in our user namespace (root on the host: always; in a user namespace: rarely)."""
    try:
        with open("/proc/self/uid_map") as fh:
            ranges = [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except (OSError, ValueError):
        return False
    return any(first <= uid < first + count for first, _, count in ranges)


def _drop_bounding_set(libc: ctypes.CDLL) -> None:
    """Empty the capability bounding set (needs CAP_SETPCAP: before setuid as root, or in the user namespace),
    so that nothing could ever bring a capability back, even through an exec that seccomp already denies."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the kernel's last capability
                break
            _check(-1, f"drop capability {cap} from the bounding set")


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """Give up every capability the user namespace granted: bounding set, ambient set, then all three sets.

    The uid is already the unprivileged inner one, so no setuid clears them as it does for root."""
    _drop_bounding_set(libc)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _bind_read_only(libc: ctypes.CDLL, source: str, target: str) -> None:
    """Bind ``source`` at ``target`` (created), then remount the bind read-only, nosuid, nodev."""
    os.makedirs(target, mode=0o755, exist_ok=True)  # noqa: PTH103 - the runner avoids pathlib (import cost)
    _check(libc.mount(source.encode(), target.encode(), None, MS_BIND, None), f"bind {source}")
    kept = os.statvfs(source).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    flags |= sum(mount_flag for vfs_flag, mount_flag in _KEPT_FLAGS if kept & vfs_flag)
    _check(libc.mount(None, target.encode(), None, flags, None), f"read-only {target}")


def _private_root(
    libc: ctypes.CDLL, workdir: str, disk_mb: int, owner: tuple[int, int], binds: list[tuple[str, str]] | None = None
) -> None:
    """Mount a size-limited tmpfs on the (empty, private) workdir, bind ``binds`` (source, path inside)
    into it read-only, and make it the process's root."""
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    opts = f"size={disk_mb}m,mode=0700,uid={owner[0]},gid={owner[1]},nr_inodes=4096".encode()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    # Huge pages for a file's full 2 MiB stretches (``within_size``): writing 10 MB onto the disk (an input
    # file, a program's output) then costs a few page allocations, not 2560 (about 15x faster). A kernel
    # without transparent huge pages refuses the option: the disk is then mounted without it.
    if libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", flags, opts + b",huge=within_size") != 0:
        _check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", flags, opts), "tmpfs")
    for source, inside in binds or []:
        _bind_read_only(libc, source, workdir + inside)
    os.chdir(workdir)
    os.chroot(".")
    os.chdir("/")


def _parent_death_signal(libc: ctypes.CDLL) -> int:
    """The parent-death signal in force (0: none). A change of credentials (setuid, a new user namespace)
    clears it, so it is read before each such change and set again after (``_rearm_parent_death``)."""
    value = ctypes.c_int(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


def _rearm_parent_death(libc: ctypes.CDLL, sig: int) -> None:
    if sig:
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _wait_or_hang_up(pid: int, watch: int | None) -> int:
    """Wait for ``pid``; if the host hangs up the frames-in channel first (it died), kill ``pid`` then."""
    if watch is not None and hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        if pidfd >= 0:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.register(watch, select.POLLRDHUP)
            done = False
            while not done:
                try:
                    events = poller.poll()
                except InterruptedError:
                    continue
                for fd, event in events:
                    if fd == pidfd:
                        done = True
                    elif event & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)  # the host is gone: nobody wants the result
                        done = True
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except InterruptedError:
            continue


def _become_pid1(libc: ctypes.CDLL, watch: int | None) -> None:
    """After unshare(CLONE_NEWPID), fork so the executing process is pid 1 of the new namespace.

    The parent keeps only the frames-in channel open, to watch it: it waits and mirrors the child's exit,
    so the host sees one status, and kills the child when the host hangs up (a killed host leaves nothing
    running). The child dies with the parent (its parent-death signal, re-armed after each privilege change).
    """
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        return
    if watch is None:
        os.closerange(0, 4096)
    else:
        if watch > 0:  # closerange(0, 0) would close everything (close_range with last = -1)
            os.closerange(0, watch)
        os.closerange(watch + 1, 4096)
    status = _wait_or_hang_up(pid, watch)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


#: ``clone``'s system call number where a raw clone is known to behave like fork (its other arguments zero).
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
#: Whether a raw ``clone(CLONE_NEWPID)`` worked in this process (None: not tried yet). A zygote tries once.
_CLONE_WORKS: list[bool] = []


def clone_runner(namespaces: int = 0, adopted: bool = False, required: bool = False) -> int:
    """``os.fork``, but the child is born in new ``namespaces`` and always a new pid namespace (pid 1 of its own
    pid namespace, so its lock-down needs no second fork, ``_become_pid1``: one process per runner).

    Both kinds of zygote clone their runners here: a plain one with the pid namespace alone (the lock-down
    unshares the rest), a confined one (``confine.RUNNER_NAMESPACES``) straight into a user namespace of the
    runner's own owning all the others, which needs no capability. ``adopted``: the child of the caller's parent
    (``CLONE_PARENT``: the runner is then the host's own child, which reaps it and reads its exit status and
    usage from the kernel, with no report to wait for). Python's own fork bookkeeping runs around the call
    (``PyOS_BeforeFork`` and the ``AfterFork`` of each side: the import lock, ``os.register_at_fork`` hooks such
    as ``random``'s reseed), with the GIL held throughout (``PyDLL``). Only for a single-threaded caller (a
    zygote: ``preload`` refuses threads, a confined one's filter too). Returns -1 where it cannot be had
    (another architecture, no privilege for the namespace, never worked here): the caller forks as before;
    ``required``, it raises OSError instead."""
    number = _SYS_CLONE.get(os.uname().machine)
    if not required and (number is None or _CLONE_WORKS == [False]):
        return -1
    if number is None:
        raise OSError(errno.ENOSYS, f"no raw clone on {os.uname().machine}")
    api, raw = ctypes.pythonapi, ctypes.PyDLL(None, use_errno=True).syscall
    raw.restype = ctypes.c_long
    flags = namespaces | CLONE_NEWPID | (CLONE_PARENT if adopted else 0) | signal.SIGCHLD
    api.PyOS_BeforeFork()
    pid = raw(ctypes.c_long(number), ctypes.c_ulong(flags), None, None, None, None)
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if not _CLONE_WORKS and not required:
        _CLONE_WORKS.append(pid > 0)
    if pid < 0 and (required or _CLONE_WORKS == [True]):  # it worked before: a real failure (no memory, pids)
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def _set_rlimits(limits: dict[str, Any]) -> None:
    cpu = int(limits.get("cpu_s") or int(limits["timeout_s"]) + 1)
    memory = int(limits["memory_mb"]) * 1024 * 1024
    disk = int(limits["disk_mb"]) * 1024 * 1024
    files = int(limits["max_open_files"])
    for res, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, disk),
        (resource.RLIMIT_NOFILE, files),
        (resource.RLIMIT_NPROC, 0),
    ):
        resource.setrlimit(res, (value, value))


def _install_seccomp(libc: ctypes.CDLL, bpf: bytes) -> None:
    """Load a classic-BPF filter compiled on the host by libseccomp (8 bytes per instruction)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    if not bpf or len(bpf) % 8:
        raise ValueError("seccomp program has the wrong size")
    prog = SockFprog(len(bpf) // 8, bpf)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def lock_down(boot: dict[str, Any], host_channel_fd: int | None = None) -> tuple[dict[str, bool], list[str]]:
    """Apply every protection the boot frame asks for; report what is active and what failed.

    Two ways to the same walls. As real root: new namespaces, private root, then setuid to the sandbox
    user. Otherwise (rootless): a user namespace first, mapping our id to the sandbox uid inside, then the
    other namespaces and the private root with the capabilities it grants, then those capabilities dropped.
    The dumpable flag is cleared only after the id maps are written (``/proc/self`` turns root-owned)."""
    libc = _libc()
    active: dict[str, bool] = {}
    errors: list[str] = list(USERNS_ERRORS)
    limits = boot["limits"]  # read first: a frame without limits fails before any wall is touched
    uid, gid = boot.get("drop_to_uid"), boot.get("drop_to_gid")
    inner = (uid if uid is not None else 65534, gid if gid is not None else 65534)
    as_root = os.geteuid() == 0 and _uid_mapped(inner[0])
    owner = inner if not as_root and boot.get("namespaces") else (uid or 0, gid or 0)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    pid_ns = in_userns = False
    entered = boot.get("entered")  # cloned into its namespaces by a confined zygote, which ran as these ids
    born_pid1 = os.getpid() == 1 and not isinstance(entered, list)  # cloned pid 1 by a zygote (``clone_runner``)
    if boot.get("namespaces") and isinstance(entered, list):
        pid_ns = in_userns = _entered_namespaces(inner, (int(entered[0]), int(entered[1])), active, errors)
        owner = inner
    elif boot.get("namespaces"):
        pid_ns, in_userns = _enter_namespaces(libc, as_root, inner, active, errors, born_pid1)
    _enter_workdir(libc, boot, limits, owner, pid_ns, active, errors)
    if pid_ns and not isinstance(entered, list) and not born_pid1:
        _become_pid1(libc, host_channel_fd)
    _drop_privileges(libc, (uid, gid) if as_root else None, in_userns, active, errors)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the last credential change, which may reset it
    _last_walls(libc, boot, limits, active, errors)
    return active, errors


def _enter_namespaces(
    libc: Any, as_root: bool, inner: tuple[int, int], active: dict[str, bool], errors: list[str], born_pid1: bool
) -> tuple[bool, bool]:
    """New namespaces (rootless: a user namespace of our own first); whether the pid namespace and a user
    namespace were entered. Born pid 1 (``born_pid1``), the process is in its pid namespace already."""
    pid_ns = in_userns = False
    death_signal = _parent_death_signal(libc)
    try:
        if not as_root:
            # Rootless: a user namespace of our own, mapping our id to the sandbox uid inside. The
            # namespaces created next belong to it; the capabilities it grants mount the private root
            # and are then dropped (``_drop_capabilities``).
            outer = (os.geteuid(), os.getegid())  # before unshare: inside, they read as the overflow id
            _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
            in_userns = True  # from here on there are capabilities to drop, even if the maps fail
            _map_ids(inner, outer)
            active["user_namespace"] = True
        flags = NAMESPACE_FLAGS & ~CLONE_NEWPID if born_pid1 else NAMESPACE_FLAGS
        _check(libc.unshare(flags), "unshare(net, mount, ipc, uts, pid)")
        active.update(dict.fromkeys(NAMESPACE_NAMES, True))
        pid_ns = True
    except OSError as exc:
        errors.append(f"namespaces: {exc}")
    _rearm_parent_death(libc, death_signal)  # a new user namespace clears it
    return pid_ns, in_userns


def _entered_namespaces(
    inner: tuple[int, int], outer: tuple[int, int], active: dict[str, bool], errors: list[str]
) -> bool:
    """Already in namespaces of its own (a confined zygote's ``clone_runner``): only its ids to map; whether it
    could."""
    try:
        _map_ids(inner, outer)
    except OSError as exc:
        errors.append(f"namespaces: {exc}")
        return False
    active["user_namespace"] = True
    active.update(dict.fromkeys(NAMESPACE_NAMES, True))
    return True


def _enter_workdir(
    libc: Any,
    boot: dict[str, Any],
    limits: dict[str, Any],
    owner: tuple[int, int],
    pid_ns: bool,
    active: dict[str, bool],
    errors: list[str],
) -> None:
    """The private root over the work directory (in a pid namespace), or at least the work directory."""
    workdir = boot.get("workdir")
    if boot.get("chroot") and workdir and pid_ns:
        try:
            _private_root(libc, workdir, int(limits["disk_mb"]), owner, private_root_binds(boot) + tz_binds())
            active["private_root"] = True
        except OSError as exc:
            errors.append(f"private root: {exc}")
    elif workdir:
        with contextlib.suppress(OSError):
            os.chdir(workdir)


def _drop_privileges(
    libc: Any,
    root_drop: tuple[int | None, int | None] | None,
    in_userns: bool,
    active: dict[str, bool],
    errors: list[str],
) -> None:
    """As real root, setuid/setgid to the sandbox user (``root_drop``); in a user namespace of our own, drop
    the capabilities it granted; otherwise the process is unprivileged already."""
    uid, gid = root_drop if root_drop is not None else (None, None)
    if root_drop is not None and uid is not None and gid is not None:
        death_signal = _parent_death_signal(libc)
        try:
            _drop_bounding_set(libc)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            active["unprivileged_user"] = True
        except OSError as exc:
            errors.append(f"drop privileges: {exc}")
        _rearm_parent_death(libc, death_signal)  # setuid/setgid clear it
    elif in_userns:
        death_signal = _parent_death_signal(libc)
        try:
            _drop_capabilities(libc)
            active["unprivileged_user"] = os.geteuid() != 0
        except OSError as exc:
            errors.append(f"drop capabilities: {exc}")
        _rearm_parent_death(libc, death_signal)  # a credential change may clear it
    elif os.geteuid() != 0:
        active["unprivileged_user"] = True


def _last_walls(
    libc: Any, boot: dict[str, Any], limits: dict[str, Any], active: dict[str, bool], errors: list[str]
) -> None:
    """rlimits, no_new_privs and the seccomp filter: after every credential change."""
    try:
        _set_rlimits(limits)
        active["rlimits"] = True
    except (OSError, ValueError) as exc:
        errors.append(f"rlimits: {exc}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        active["no_new_privs"] = True
    if boot.get("seccomp_bpf_b64"):
        try:
            _install_seccomp(libc, base64.b64decode(boot["seccomp_bpf_b64"]))
            active["seccomp"] = True
        except (OSError, ValueError) as exc:
            errors.append(f"seccomp: {exc}")


def _reexec_in_user_namespace(argv: list[str]) -> None:
    """Rootless start (``--userns``): enter a user namespace mapping our id to root, then exec this
    interpreter again inside it, before anything else runs.

    A process's memory belongs to the user namespace it exec'd in. Exec'd here, the runner (and every
    child a zygote forks) stays inspectable through ``/proc/<pid>/ns`` and ``root`` by the host, which owns
    this namespace, after the dumpable flag is cleared: the host verifies namespaces from outside, as it
    does as root. Each runner then enters a nested user namespace of its own in ``lock_down``. On failure
    the reason is kept for the ready report and the lock-down proceeds without (the host then refuses)."""
    libc = _libc()
    outer = (os.geteuid(), os.getegid())
    try:
        _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
        _map_ids((0, 0), outer)
    except OSError as exc:
        USERNS_ERRORS.append(f"user namespace: {exc}")
        return
    script = os.path.abspath(sys.argv[0])  # noqa: PTH100 - the runner avoids pathlib (import cost)
    args = [sys.executable, "-I", "-S", "-B", script, *(a for a in argv if a != "--userns")]
    os.execv(sys.executable, args)  # noqa: S606 - this interpreter again, same arguments
