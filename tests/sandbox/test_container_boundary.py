"""The container backends' OS boundary, attacked by a program that has fully escaped RestrictedPython.

The real image, the real container configuration and the runner's real boot and lock-down; only the
command differs: the runner is started with its compile step replaced by plain ``compile`` and its
builtins by the real ones (the same technique as ``escaped_runner.py`` for the subprocess backend). What
an attack achieves here is what an attacker with a RestrictedPython bypass would achieve in a container.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, SandboxConfig, handoff
from sandforge.sandbox.backends import docker_backend, oci_backend
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.backends.docker_backend import DockerBackend
from sandforge.sandbox.backends.oci_backend import OciBackend
from sandforge.sandbox.image import IMAGE_INSIDE

ESCAPED_BOOTSTRAP_TEMPLATE = f"""
import ast, os, signal, socket, sys, types
sys.path.insert(0, {str(Path(IMAGE_INSIDE).parent)!r})
from inside import serving, start, world

def compile_unrestricted(code):
    module = ast.parse(code, world.TOOL_FILENAME, "exec")
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in ("context", "args", "kwargs")],
                         vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    func = ast.FunctionDef(name=world.TOOL_FUNCTION, args=args, body=module.body or [ast.Pass()],
                           decorator_list=[], returns=None)
    wrapper = ast.fix_missing_locations(ast.Module(body=[func], type_ignores=[]))
    return compile(wrapper, world.TOOL_FILENAME, "exec"), None

def unrestricted_globals(proxies, stdout, bridge):
    def _print(*values, **kwargs):
        stdout.write(" ".join(str(v) for v in values) + kwargs.get("end", "\\n"))
    return {{"__builtins__": __builtins__, "__name__": "escaped", "print": _print}}

serving.compile_program = compile_unrestricted
serving.build_globals = unrestricted_globals
serving.shipped_code = lambda frame: None  # the text, compiled unrestricted; never what the host precompiled
serving.forget_lockdown_modules = lambda: []  # the attacker is assumed to have them back
{{TRIPWIRE}}
os._exit(start.main(["--result-stdout", *sys.argv[1:]]))
"""
#: The attacker has beaten the tripwire too (the OS boundary alone is under test): the runner reports the
#: protection without installing the hook.
ESCAPED_BOOTSTRAP = ESCAPED_BOOTSTRAP_TEMPLATE.replace(
    "{TRIPWIRE}", "serving.tripwire = types.SimpleNamespace(install=lambda: True, arm=lambda *args: None)"
)
#: The same escape with the real tripwire armed (tests/sandbox/test_tripwire.py).
ESCAPED_BOOTSTRAP_ARMED = ESCAPED_BOOTSTRAP_TEMPLATE.replace("{TRIPWIRE}", "")

LIMITS = Limits(timeout_s=10, memory_mb=128, disk_mb=4, max_processes=12)

pytestmark = pytest.mark.docker


@pytest.fixture(
    params=[
        "docker",
        pytest.param("gvisor", marks=pytest.mark.gvisor),
        pytest.param("runc", marks=pytest.mark.oci("runc")),
        pytest.param("runsc", marks=pytest.mark.oci("runsc")),
    ]
)
def escaped_backend(
    request: pytest.FixtureRequest, docker_env: object, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    """Each container backend with the escaped runner: through dockerd (runc, runsc) and driven directly."""
    backend = container_backend(request.param, ESCAPED_BOOTSTRAP, monkeypatch)
    try:
        yield backend
    finally:
        backend.close()


def container_backend(name: str, bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """Container backend ``name`` whose containers start ``bootstrap`` instead of the runner."""
    command = ["-I", "-S", "-B", "-c", bootstrap]
    monkeypatch.setattr(docker_backend, "COMMAND", ["python3", *command])
    monkeypatch.setattr(oci_backend, "COMMAND", ["/usr/bin/python3", *command])
    config = SandboxConfig(pool_size=0)
    if name in ("runc", "runsc"):
        return OciBackend(config, runtime=name)  # type: ignore[arg-type]
    return DockerBackend(config, runtime="runsc" if name == "gvisor" else None)


def escaped(backend: Backend, code: str) -> ExecutionOutcome:
    worker = backend.spawn(LIMITS)
    return worker.execute(ExecutionRequest(code=code, limits=LIMITS), None)


def expect_ok(backend: Backend, code: str) -> ExecutionOutcome:
    out = escaped(backend, code)
    assert out.ok, f"attack harness failed: {out.error_type}: {out.error_message}\n{out.stderr}"
    return out


def test_escaped_code_really_is_unrestricted(escaped_backend: Backend) -> None:
    out = expect_ok(escaped_backend, "import os\nreturn [os.getuid(), type(().__class__.__base__).__name__]")
    assert out.value == [65534, "type"]


def test_host_files_are_not_in_the_container(escaped_backend: Backend, tmp_path: Path) -> None:
    marker = Path("/tmp") / f"sandforge-host-marker-{uuid.uuid4().hex}"
    marker.write_text("host secret")
    try:
        out = expect_ok(
            escaped_backend,
            "import os\nfound = {}\n"
            f"for p in [{str(marker)!r}, '/work', '/root/.bashrc', '/etc/shadow', '/var/run/docker.sock']:\n"
            "    try:\n        found[p] = open(p).read()[:20] if not os.path.isdir(p) else 'dir'\n"
            "    except OSError as e:\n        found[p] = type(e).__name__\n"
            "return found",
        )
    finally:
        marker.unlink()
    assert "host secret" not in str(out.value)
    assert out.value["/work"] == "FileNotFoundError"
    assert out.value["/var/run/docker.sock"] == "FileNotFoundError"
    assert out.value["/etc/shadow"] in ("PermissionError", "FileNotFoundError")


def test_environment_is_empty(escaped_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_TEST_SECRET", "hunter2")
    out = expect_ok(escaped_backend, "import os\nreturn dict(os.environ)")
    assert "hunter2" not in str(out.value)
    assert not any(k.startswith("SANDFORGE") for k in out.value)


def test_network_is_denied(escaped_backend: Backend) -> None:
    out = expect_ok(
        escaped_backend,
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    return 'connected'\n"
        "except OSError as e:\n    return type(e).__name__",
    )
    assert out.value != "connected"


def test_process_creation_is_denied(escaped_backend: Backend) -> None:
    out = expect_ok(
        escaped_backend,
        "import os\ntry:\n    pid = os.fork()\nexcept OSError as e:\n    return e.errno\n"
        "if pid == 0:\n    os._exit(0)\nreturn 'forked'",
    )
    assert out.value != "forked"


def test_fork_bomb_is_contained(escaped_backend: Backend) -> None:
    out = escaped(escaped_backend, "import os\nwhile True:\n    os.fork()")
    assert out.status == "error"


def test_host_processes_cannot_be_signalled(escaped_backend: Backend) -> None:
    host = os.getpid()
    out = expect_ok(
        escaped_backend,
        f"import os, signal\ntry:\n    os.kill({host}, signal.SIGTERM)\n    return 'sent'\n"
        "except OSError as e:\n    return type(e).__name__",
    )
    assert out.value != "sent"
    os.kill(host, 0)  # still alive


def test_disk_fill_is_bounded(escaped_backend: Backend) -> None:
    out = expect_ok(
        escaped_backend,
        "results = {}\nfor path in ('/fill', '/tmp/fill'):\n    written = 0\n    try:\n"
        "        with open(path, 'wb') as f:\n            while written < 64 * 1024 * 1024:\n"
        "                f.write(b'x' * 65536)\n                written += 65536\n"
        "    except OSError as e:\n        results[path] = [type(e).__name__, written]\n"
        "    else:\n        results[path] = ['filled', written]\nreturn results",
    )
    assert out.value["/fill"][0] in ("OSError", "PermissionError")  # read-only root file system
    kind, written = out.value["/tmp/fill"]
    assert kind != "filled" and written <= LIMITS.disk_mb * 1024 * 1024


def test_forged_frames_cannot_forge_what_the_host_reports(escaped_backend: Backend) -> None:
    """An escaped program can write to the result channel (the runner's dup of stdout), but the host
    reads the channel to its end: a forged frame before the runner's own makes two results, a violation the
    host records as its own security event. Nor can it change what the host reports about the sandbox: the
    protections come from the engine's view of the container, and the frame cannot claim host-measured usage."""
    forged = {"type": "result", "status": "ok", "value": "forged"}
    code = (
        "import os, json, struct, sys\n"
        "f = sys._getframe()\n"
        "while 'out_fd' not in f.f_locals:\n    f = f.f_back\n"
        f"body = json.dumps({forged!r}).encode()\n"
        "os.write(f.f_locals['out_fd'], struct.pack('>I', len(body)) + body)\n"
        "return 'real'"
    )
    out = escaped(escaped_backend, code)
    reference = escaped_backend.spawn(LIMITS)
    try:
        expected_protections = reference.protections
    finally:
        reference.destroy()
    assert out.protections == expected_protections and out.protections["network_none"]
    assert out.usage.source == "sandbox"  # container usage is always labelled as the runner's report
    assert out.error_type == ErrorType.SANDBOX_VIOLATION and out.value is None, (out.error_type, out.value)
    assert out.security_event is not None and out.security_event.source == "host"
    assert out.security_event.event == "second_result"


def test_a_passed_context_value_cannot_be_changed(escaped_backend: Backend) -> None:
    """runc gets large context values as sealed memfds: found, they cannot be written, resized or unsealed,
    and the socket they came on is one way; the other backends get them as hand-off files (nothing to find
    among the descriptors)."""
    from sandforge.sandbox.context import ContextSnapshot
    from tests.sandbox.test_context_memfd import ATTACK, BIG

    runc = isinstance(escaped_backend, OciBackend) and escaped_backend.runtime == "runc"
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    before = bytes(snapshot["big"])
    worker = escaped_backend.spawn(LIMITS)
    code = ATTACK.replace("INPUT_FD", str(oci_backend.INPUT_FD if runc else 0))
    out = worker.execute(ExecutionRequest(code=code, context=snapshot, limits=LIMITS), None)
    assert out.ok, f"attack harness failed: {out.error_type}: {out.error_message}\n{out.stderr}"
    *memfds, back = out.value
    runner_map = memfds.pop()
    assert runner_map == {"runner_map": "TypeError"}  # the runner's mapping is read-only on every backend
    if runc:
        assert memfds
        for tried in memfds:
            assert tried["size"] == len(before)
            assert all(tried[name] == 1 for name in ("write", "pwrite", "truncate", "grow", "mmap_shared", "unseal"))
        assert back == {"stdin": 32}  # EPIPE: the socket into the container is one way
    else:  # the runner's mapping keeps a read-only descriptor of the hand-off file (see the test below)
        for tried in memfds:
            assert tried["size"] == len(before)
            assert all(tried[name] not in ("done", None) for name in tried if name != "size"), tried
        assert back["stdin"] != "done"
    assert snapshot["big"] == before
    sealed = snapshot.sealed("big")
    assert sealed is not None and os.pread(sealed.fd, len(before) + 1, 0) == before


HANDOFF_ATTACK = """
import os
where = "/sandforge/in"
tried = {}
def attempt(name, action):
    try:
        action()
        tried[name] = "done"
    except OSError as exc:
        tried[name] = exc.errno
attempt("list", lambda: os.listdir(where))
attempt("write", lambda: open(where + "/0", "r+b").write(b"HACK"))
attempt("append", lambda: open(where + "/0", "ab").write(b"HACK"))
attempt("create", lambda: open(where + "/new", "wb"))
attempt("unlink", lambda: os.unlink(where + "/0"))
attempt("rename", lambda: os.rename(where + "/0", where + "/1"))
attempt("chmod", lambda: os.chmod(where + "/0", 0o666))
attempt("replace_token", lambda: os.replace(where + "/0", where + "/token"))
attempt("mkdir", lambda: os.mkdir(where + "/d"))
with open(where + "/0", "rb") as fh:
    tried["head"] = fh.read(4).decode()
options = [line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == where]
tried["options"] = options[0].split(",") if options else None
return tried
"""


@pytest.mark.parametrize(
    "escaped_backend",
    [
        "docker",
        pytest.param("gvisor", marks=pytest.mark.gvisor),
        pytest.param("runsc", marks=pytest.mark.oci("runsc")),
    ],
    indirect=True,
)
def test_the_handoff_directory_cannot_be_changed_or_listed(escaped_backend: Backend) -> None:
    """The backends that hand values off: the directory is mounted read-only, cannot be listed, and no file in
    it can be written, created, removed, renamed or re-permissioned; the host's value is unchanged."""
    from sandforge.sandbox.context import ContextSnapshot
    from tests.sandbox.test_context_memfd import BIG

    snapshot = ContextSnapshot.from_dict({"big": BIG})
    before = bytes(snapshot["big"])
    worker = escaped_backend.spawn(LIMITS)
    out = worker.execute(ExecutionRequest(code=HANDOFF_ATTACK, context=snapshot, limits=LIMITS), None)
    assert out.ok, f"attack harness failed: {out.error_type}: {out.error_message}\n{out.stderr}"
    tried = out.value
    assert tried.pop("head") == '"xxx'  # the harness really found the handed-off value
    options = tried.pop("options")
    assert options is None or "ro" in options  # gVisor's mountinfo may not list the bind mount
    assert tried.pop("list") in (errno.EACCES, errno.EPERM)
    assert all(result in (errno.EROFS, errno.EACCES, errno.EPERM) for result in tried.values()), tried
    assert snapshot["big"] == before
    stored = snapshot.shared("big", handoff.StoredText)
    assert stored is not None and stored.path.read_bytes() == before
