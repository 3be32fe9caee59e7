"""The subprocess backend's OS boundary, attacked by a program that has fully escaped RestrictedPython.

``escaped_runner.py`` performs the real boot and lock-down, then runs the program as plain Python with
the modules the real runner has loaded (os, ctypes, socket, ...). Whatever succeeds here would succeed for
an attacker who finds a RestrictedPython bypass, so each attack must be stopped by the kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend

ESCAPED = Path(__file__).with_name("escaped_runner.py")
LIMITS = Limits(timeout_s=5, memory_mb=256, disk_mb=4, max_output_bytes=8192)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and not Path("/proc/self/ns/user").exists(), reason="needs namespaces"
)


def escaped(code: str, limits: Limits = LIMITS, **kw: object) -> ExecutionOutcome:
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)
    worker = backend.spawn(limits)
    return worker.execute(ExecutionRequest(code=code, limits=limits, **kw), None)  # type: ignore[arg-type]


def expect_denied(code: str) -> ExecutionOutcome:
    """Run an attack that reports what it managed to do; it must have managed nothing."""
    out = escaped(code)
    assert out.ok, f"attack harness failed: {out.error_type}: {out.error_message}\n{out.stderr}"
    return out


def test_escaped_code_really_is_unrestricted() -> None:
    """Guard against a vacuous suite: the escaped runner must run code RestrictedPython would refuse."""
    out = expect_denied("import os\nreturn [os.getpid(), type(().__class__.__base__).__name__]")
    assert out.value == [1, "type"]  # pid 1: it is alone in its own pid namespace


def test_host_files_are_invisible() -> None:
    out = expect_denied(
        "import os\nfound = {}\n"
        "for p in ['/etc/passwd', '/root', '/proc/1/environ', '/work', '/home', '/tmp', '/']:\n"
        "    try:\n        found[p] = sorted(os.listdir(p)) if os.path.isdir(p) else open(p).read()[:20]\n"
        "    except OSError as e:\n        found[p] = type(e).__name__\n"
        "return found"
    )
    found = out.value
    # the root is a private tmpfs, empty but for the time-zone database's read-only bind (/usr/share/zoneinfo,
    # for zoneinfo: issue 38) and the program's file area (issue 41)
    assert set(found["/"]) <= {"usr", "inputs", "outputs"}, found
    for path in ("/etc/passwd", "/root", "/proc/1/environ", "/work", "/home"):
        assert found[path] == "FileNotFoundError", (path, found[path])


def test_host_environment_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_TEST_SECRET", "hunter2")
    out = expect_denied("import os\nreturn dict(os.environ)")
    # Nothing inherited; the interpreter itself sets LC_CTYPE when it coerces the C locale (PEP 538).
    assert set(out.value) <= {"LC_CTYPE"}, out.value


def test_network_is_denied() -> None:
    out = expect_denied(
        "import socket\nresults = []\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX, socket.AF_NETLINK):\n"
        "    kind = socket.SOCK_STREAM if family != socket.AF_NETLINK else socket.SOCK_RAW\n"
        "    try:\n        socket.socket(family, kind)\n"
        "        results.append('opened')\n"
        "    except OSError as e:\n        results.append(e.errno)\n"
        "return results"
    )
    assert "opened" not in out.value
    assert set(out.value) == {1}  # EPERM from seccomp for every family


def test_network_denied_even_through_ctypes() -> None:
    out = expect_denied(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\nreturn [fd, ctypes.get_errno()]"
    )
    assert out.value == [-1, 1]


def test_process_creation_is_denied() -> None:
    out = expect_denied(
        "import os\nresults = {}\n"
        "for name, fn in [('fork', os.fork), ('exec', lambda: os.execv('/bin/sh', ['sh'])),\n"
        "                 ('posix_spawn', lambda: os.posix_spawn('/bin/true', ['true'], {}))]:\n"
        "    try:\n        fn()\n        results[name] = 'spawned'\n"
        "    except OSError as e:\n        results[name] = e.errno\n"
        "return results"
    )
    assert "spawned" not in out.value.values(), out.value


def test_fork_bomb_is_contained() -> None:
    out = escaped("import os\nwhile True:\n    os.fork()")
    assert out.status == "error"
    assert out.error_type in (ErrorType.SANDBOX_VIOLATION, ErrorType.EXECUTION)


def test_signalling_the_host_fails() -> None:
    host = os.getpid()
    out = expect_denied(
        f"import os, signal\nresults = []\n"
        f"for pid in ({host}, 1, -1):\n"
        f"    try:\n        os.kill(pid, signal.SIGTERM)\n        results.append('sent')\n"
        f"    except OSError as e:\n        results.append(e.errno)\n"
        f"return results"
    )
    assert "sent" not in out.value
    assert psutil.pid_exists(host)


def test_privileges_are_dropped_and_cannot_be_regained() -> None:
    out = expect_denied(
        "import os\nresults = {'uid': os.getuid(), 'euid': os.geteuid()}\n"
        "for name, fn in [('setuid', lambda: os.setuid(0)), ('chroot', lambda: os.chroot('/')),\n"
        "                 ('unshare', lambda: os.unshare(0x10000000) if hasattr(os, 'unshare') else None)]:\n"
        "    try:\n        fn()\n        results[name] = 'allowed'\n"
        "    except OSError as e:\n        results[name] = e.errno\n"
        "return results"
    )
    if os.geteuid() == 0:
        assert out.value["uid"] == 65534 and out.value["euid"] == 65534
    assert out.value["setuid"] == 1 and out.value["chroot"] == 1


def test_disk_fill_is_bounded() -> None:
    out = escaped(
        "import os\nchunk = b'x' * (1024 * 1024)\n"
        "with open('/fill', 'wb') as f:\n    while True:\n        f.write(chunk)"
    )
    assert out.status == "error"
    assert any(s in (out.error_message or "") for s in ("No space left", "File too large", "EFBIG", "ENOSPC")) or (
        out.error_type in (ErrorType.SANDBOX_VIOLATION, ErrorType.EXECUTION)
    ), out.error_message


def test_many_small_files_are_bounded() -> None:
    out = escaped("i = 0\nwhile True:\n    open(f'/f{i}', 'w').close()\n    i += 1")
    assert out.status == "error"


def test_writing_a_second_result_frame_is_a_violation() -> None:
    """An escaped program can choose its own result, but it cannot smuggle in another one after it."""
    code = (
        "import os, json, struct\n"
        "body = json.dumps({'type': 'result', 'status': 'ok', 'value': 'forged', 'context': {}}).encode()\n"
        "os.write(result_fd, struct.pack('>I', len(body)) + body)\n"
        "return 'real'"
    )
    out = escaped(code)
    assert out.status == "error" and out.error_type == ErrorType.SANDBOX_VIOLATION


def test_garbage_on_the_result_channel_is_a_violation() -> None:
    out = escaped("import os\nos.write(result_fd, b'\\xff\\xff\\xff\\xffgarbage')\nreturn 1")
    assert out.error_type == ErrorType.SANDBOX_VIOLATION


def test_host_measures_usage_not_the_sandbox() -> None:
    out = escaped("x = bytearray(64 * 1024 * 1024)\nreturn 1")
    assert out.ok and out.usage.source == "host"
    assert out.usage.peak_memory_mb >= 64


def test_workdir_is_removed_afterwards() -> None:
    """What a program writes stays in its own root: the host directory its root is mounted on (the backend's,
    shared by its workers) holds nothing of it, and is removed with the backend."""
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)
    try:
        worker = backend.spawn(LIMITS)
        workdir = worker._workdir
        assert workdir.is_dir() and not worker.owns_workdir
        out = worker.execute(ExecutionRequest(code="open('/scratch', 'w').write('x')\nreturn 1", limits=LIMITS), None)
        assert out.ok, out.error_message
        assert list(workdir.iterdir()) == []
    finally:
        backend.close()
    assert not workdir.exists()


def test_a_worker_without_an_enforced_private_root_has_a_workdir_of_its_own() -> None:
    """Where the private root is waived, a runner may work in its host directory: then no two share one, and
    each is removed with its worker."""
    backend = SubprocessBackend(SandboxConfig(pool_size=0, allow_missing=["private_root"]), runner=ESCAPED)
    try:
        first, second = backend.spawn(LIMITS), backend.spawn(LIMITS)
        assert first.owns_workdir and second.owns_workdir and first._workdir != second._workdir
        out = first.execute(ExecutionRequest(code="return 1", limits=LIMITS), None)
        assert out.ok, out.error_message
        assert not first._workdir.exists()
        second.destroy()
        assert not second._workdir.exists()
    finally:
        backend.close()
