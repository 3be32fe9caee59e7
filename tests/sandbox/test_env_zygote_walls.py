"""Issue 39 item 3: an environment zygote is confined before it imports (``sandbox/inside/confine.py``), so a
package's import-time code runs with the walls of a fresh sandbox, and runners forked from it are as fresh as
a new one's.

``hostile`` is a distribution made on the spot whose import attacks the walls: it reads a host file, writes
into a host directory and into its own (read-only) environment, opens a socket, signals its parent (in a
zygote: the host process), starts a thread, and clones a process into a user namespace of its own that
tries the ``chroot`` escape towards the host's tree; it records what happened, counts its imports in
``builtins`` and installs a signal handler. The same program runs with the module pre-imported by a zygote
and imported by the runner itself: the attacks fail alike, nothing reaches the host, and each run starts
from the import's state, never a sibling's.
``lingers`` leaves a process running at import: it is never pre-imported."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.envzygotes import unconfined
from tests.environments.helpers import require_wheelhouse
from tests.sandbox.envbuild import EnvFactory, target_for
from tests.sandbox.test_env_zygotes import _env_zygotes as _zygotes

HOSTILE = """
import builtins
import ctypes
import errno
import os
import signal
import socket
import threading

SECRET = {secret!r}
HOST_DIR = {host_dir!r}
IMPORTED_BY = os.getpid()


def _try(action):
    try:
        result = action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        return type(exc).__name__
    return "done" if result is None else result


def _read_secret():
    with open(SECRET) as fh:
        return "read: " + fh.read()


def _write_host():
    with open(os.path.join(HOST_DIR, "planted"), "w") as fh:
        fh.write("planted")


def _write_site():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted.py"), "w") as fh:
        fh.write("planted")


def _network():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()


def _thread():
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()


def _signal_parent():
    os.kill(os.getppid(), 0)


def _escape():
    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER): every capability in it
    if pid < 0:
        return "clone: " + errno.errorcode.get(ctypes.get_errno(), "?")
    if pid == 0:
        out = "nothing"
        try:
            if libc.chroot(b"/proc") != 0:
                out = "chroot: " + errno.errorcode.get(ctypes.get_errno(), "?")
            else:
                for _ in range(64):
                    os.chdir("..")
                libc.chroot(b".")
                out = _try(_read_secret)
        except BaseException as exc:
            out = type(exc).__name__
        os.write(w, str(out).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    return "clone: " + os.read(r, 1000).decode()


PROBES = {{
    "read_secret": _try(_read_secret),
    "write_host": _try(_write_host),
    "write_site": _try(_write_site),
    "network": _try(_network),
    "signal_parent": _try(_signal_parent),
    "thread": _try(_thread),
    "escape": _try(_escape),
    "uid": os.getuid(),
}}
builtins.HOSTILE_IMPORTS = getattr(builtins, "HOSTILE_IMPORTS", 0) + 1
signal.signal(signal.SIGUSR1, lambda *args: None)


def probes():
    return dict(PROBES)


def bump():
    builtins.HOSTILE_IMPORTS += 1
    return builtins.HOSTILE_IMPORTS


def state():
    return {{"imported_by": IMPORTED_BY, "pid": os.getpid(), "sigchld": str(signal.getsignal(signal.SIGCHLD)),
             "sigusr1": callable(signal.getsignal(signal.SIGUSR1))}}
"""

LINGERS = b"""
import ctypes
import os
import time

if os.fork() == 0:
    os.setsid()  # out of the zygote's process group
    ctypes.CDLL(None).prctl(15, b"sf-lingers", 0, 0, 0)  # PR_SET_NAME: the test looks for it
    time.sleep(600)
    os._exit(0)
LEFT = True
"""

PROGRAM = """
import hostile
return {"probes": hostile.probes(), "count": hostile.bump(), "state": hostile.state()}
"""


class HostileEnvironments(EnvFactory):
    def __init__(self, root: Path, wheelhouse: Path) -> None:
        self.secret, self.host_dir = root / "secret.txt", root / "hostdir"
        self.secret.write_text("the host's secret")
        self.host_dir.mkdir()
        source = HOSTILE.format(secret=str(self.secret), host_dir=str(self.host_dir)).encode()
        super().__init__(root, wheelhouse, {"hostile": source, "lingers": LINGERS})

    def hostile(self, sandbox: Sandbox) -> EnvironmentMount:
        return self.mount(target_for(sandbox, "subprocess", self.targets), ("hostile",), ("hostile",))

    def lingers(self, sandbox: Sandbox) -> EnvironmentMount:
        return self.mount(target_for(sandbox, "subprocess", self.targets), ("lingers",), ("lingers",))


@pytest.fixture(scope="module")
def hostile_envs(tmp_path_factory: pytest.TempPathFactory) -> HostileEnvironments:
    return HostileEnvironments(tmp_path_factory.mktemp("hostileenvs"), require_wheelhouse())


@pytest.fixture
def zygote_sandbox() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0, env_zygotes_max=2)) as sb:
        backend = sb._backend("subprocess")
        assert isinstance(backend, SubprocessBackend)
        if backend.env_zygotes_off:
            pytest.skip(f"environment zygotes cannot be confined here: {backend.env_zygotes_off}")
        yield sb


def _runs(sandbox: Sandbox, mount: EnvironmentMount, n: int) -> list[dict[str, Any]]:
    values = []
    for _ in range(n):
        outcome = sandbox.execute(ExecutionRequest(code=PROGRAM, environment=mount))
        assert outcome.ok, (outcome.error_type, outcome.error_message, outcome.stderr[-2000:])
        values.append(outcome.value)
    return values


def test_a_packages_import_attacks_fail_in_the_zygote_as_in_a_fresh_sandbox(
    hostile_envs: HostileEnvironments, zygote_sandbox: Sandbox
) -> None:
    """Pre-imported by the confined zygote (before any runner exists) or imported by the runner itself: the
    host file is not read, nothing is written into the host directory, no socket, no signal to the parent (in
    the zygote: the host process), no thread; in the zygote, a process cloned into a user namespace of its own
    (every capability there) reaches nothing through ``chroot`` either (a fresh runner cannot clone at all)."""
    mount = hostile_envs.hostile(zygote_sandbox)
    preloaded = _runs(zygote_sandbox, mount, 2)
    assert [z["env_id"] for z in _zygotes(zygote_sandbox)] == [mount.env_id]
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0, env_zygotes_max=0)) as fresh_sandbox:
        fresh = _runs(fresh_sandbox, mount, 1)
    for value in preloaded:
        assert value["state"]["imported_by"] != value["state"]["pid"]  # the zygote imported it
    assert fresh[0]["state"]["imported_by"] == fresh[0]["state"]["pid"]  # the runner imported it
    zygote_probes, fresh_probes = preloaded[0]["probes"], fresh[0]["probes"]
    walls = ("read_secret", "write_host", "write_site", "network", "signal_parent", "thread", "uid")
    assert {k: zygote_probes[k] for k in walls} == {k: fresh_probes[k] for k in walls}, (zygote_probes, fresh_probes)
    assert zygote_probes["read_secret"] == "ENOENT" and zygote_probes["write_host"] == "ENOENT"
    assert zygote_probes["write_site"] == "EROFS"  # the environment, read-only there as in a runner
    assert zygote_probes["network"] == "EPERM" and zygote_probes["signal_parent"] == "EPERM"
    assert zygote_probes["thread"] == "RuntimeError"
    assert zygote_probes["uid"] != 0
    assert fresh_probes["escape"] == "clone: EPERM"  # a fresh runner may not make a process
    assert zygote_probes["escape"] == "clone: ENOENT"  # the chroot escape reached only the zygote's own root
    assert list(hostile_envs.host_dir.iterdir()) == []


def test_each_runner_starts_from_the_imports_state_not_a_siblings(
    hostile_envs: HostileEnvironments, zygote_sandbox: Sandbox
) -> None:
    """A run changes what the import left (a count in ``builtins``): the next runner of the same zygote sees
    the import's state again, as a fresh runner would; the import's signal handler is there, the zygote's own
    SIGCHLD handler is not."""
    mount = hostile_envs.hostile(zygote_sandbox)
    preloaded = _runs(zygote_sandbox, mount, 3)
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0, env_zygotes_max=0)) as fresh_sandbox:
        fresh = _runs(fresh_sandbox, mount, 1)
    assert [v["count"] for v in preloaded] == [2, 2, 2] == [fresh[0]["count"]] * 3
    for value in preloaded:
        assert value["state"]["sigchld"] == fresh[0]["state"]["sigchld"]
        assert value["state"]["sigusr1"] is fresh[0]["state"]["sigusr1"] is True


def test_the_zygote_is_confined_as_the_host_sees_it(hostile_envs: HostileEnvironments, zygote_sandbox: Sandbox) -> None:
    """Verified from outside (``/proc``), not as claimed: namespaces of its own, a root that is not the host's,
    not root with no capability, ``no_new_privs``, a seccomp filter, rlimits."""
    mount = hostile_envs.hostile(zygote_sandbox)
    _runs(zygote_sandbox, mount, 1)
    (zygote,) = _zygotes(zygote_sandbox)
    pid = int(str(zygote["pid"]))
    assert unconfined(pid) == []
    status = Path(f"/proc/{pid}/status").read_text()
    assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_a_package_that_leaves_a_process_is_never_preimported(
    hostile_envs: HostileEnvironments, zygote_sandbox: Sandbox
) -> None:
    """``lingers`` forks a process at import and leaves it: the zygote refuses to serve (the host ends what it
    left), and the program imports the package in its own run, where a fork is refused."""
    mount = hostile_envs.lingers(zygote_sandbox)
    outcome = zygote_sandbox.execute(ExecutionRequest(code="import lingers\nreturn lingers.LEFT", environment=mount))
    assert _zygotes(zygote_sandbox) == []
    assert not outcome.ok and "Operation not permitted" in (outcome.error_message or ""), outcome
    assert _named("sf-lingers") == []


def _named(comm: str) -> list[int]:
    """Live processes named ``comm`` (zombies are over)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            named = entry.name.isdigit() and (entry / "comm").read_text().strip() == comm
            if named and (entry / "stat").read_text().split(") ", 1)[1][0] != "Z":
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def test_no_environment_zygote_where_it_cannot_be_confined(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rootless (only real root can mount the zygote's own ``/proc``) there is none, whatever the bound says:
    the backend keeps zero and says why (``sandforge doctor`` prints it)."""
    from sandforge.sandbox.backends import subprocess_backend

    monkeypatch.setattr(subprocess_backend, "rootless", lambda config: True)
    backend = SubprocessBackend(SandboxConfig(backend="subprocess", env_zygotes_max=2))
    try:
        assert backend.env_zygotes_off is not None and backend.env_zygotes_off.startswith("rootless")
        assert backend.env_zygotes.bound == 0
    finally:
        backend.close()
