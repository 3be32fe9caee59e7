"""The sandbox layer's rooms: backends share neutral modules and never import one another; each backend
reports exactly the protections its table says; a channel's capabilities are stated on its type."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandforge.sandbox import ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox.backends import docker_backend, oci_backend, subprocess_backend
from sandforge.sandbox.channel import PipeIO, SocketIO, Stream, WorkerIO, socket_channel
from sandforge.sandbox.context import SEALED_MIN_BYTES, ContextSnapshot
from sandforge.sandbox.exchange import send_execute
from sandforge.sandbox.protections import (
    CONTAINER_PROTECTIONS,
    PROTECTIONS,
    PROVIDED,
    ROOTLESS_PROTECTIONS,
    SUBPROCESS_PROTECTIONS,
    Protection,
    parse_list,
)

BACKENDS_DIR = Path(__file__).resolve().parents[2] / "sandbox" / "backends"
PACKAGE = "sandforge.sandbox.backends"
#: What a backend module may import from its own folder: the one interface all of them implement.
SHARED = {"base"}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth, lazily or not), as absolute dotted names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = PACKAGE.rsplit(".", node.level - 1)[0] if node.level > 1 else PACKAGE
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def sibling_imports(path: Path) -> set[str]:
    siblings = {p.stem for p in BACKENDS_DIR.glob("*.py")} - {"__init__", path.stem} - SHARED
    return {
        name
        for name in imported_modules(path)
        for sibling in siblings
        if name == f"{PACKAGE}.{sibling}" or name.startswith(f"{PACKAGE}.{sibling}.")
    }


@pytest.mark.parametrize("path", sorted(BACKENDS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_backend_imports_another(path: Path) -> None:
    assert sibling_imports(path) == set(), f"{path.name} imports a sibling backend; share a module in sandbox/"


def test_the_import_check_sees_a_sibling_import(tmp_path: Path) -> None:
    """The check above is not vacuous: each way of writing an import of a sibling is caught."""
    for line in (
        "from sandforge.sandbox.backends.subprocess_backend import PipeIO",
        "from sandforge.sandbox.backends import docker_backend",
        "from .oci_backend import COMMAND",
        "def f():\n    import sandforge.sandbox.backends.oci_backend",
    ):
        probe = tmp_path / "probe_backend.py"
        probe.write_text(line + "\n")
        assert sibling_imports(probe), line
    probe.write_text("from sandforge.sandbox.backends.base import Worker\n")
    assert sibling_imports(probe) == set()


# --- the protection tables ---------------------------------------------------------------------------


def test_every_backend_has_a_table_of_known_protections() -> None:
    assert set(PROVIDED) == {"subprocess", "docker", "gvisor", "runc", "runsc"}
    for backend, provided in PROVIDED.items():
        assert provided and set(provided) <= set(PROTECTIONS), backend
        assert len(set(provided)) == len(provided), backend
    assert Protection.GVISOR in PROVIDED["gvisor"] and Protection.GVISOR in PROVIDED["runsc"]
    assert Protection.GVISOR not in PROVIDED["docker"] and Protection.GVISOR not in PROVIDED["runc"]


def test_a_protection_is_its_name() -> None:
    assert Protection.SECCOMP == "seccomp" and f"{Protection.PID_NAMESPACE}" == "pid_namespace"
    assert parse_list("seccomp, rlimits", "X") == (Protection.SECCOMP, Protection.RLIMITS)
    assert SandboxConfig(allow_missing=("net_namespace",)).allow_missing == (Protection.NET_NAMESPACE,)


def test_a_misspelt_protection_is_refused_not_missing() -> None:
    with pytest.raises(ValueError, match="unknown protection 'secomp'"):
        parse_list("secomp", "SANDFORGE_REQUIRE_PROTECTIONS")
    with pytest.raises(ValidationError):
        SandboxConfig(required_protections=("secomp",))  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        _ = Protection.SECOMP  # type: ignore[attr-defined]


def test_docker_reports_exactly_its_table() -> None:
    """Whatever the engine says (here: nothing), every protection of the table is reported, no other."""
    for runtime, name in ((None, "docker"), ("runsc", "gvisor")):
        seen = docker_backend.verify_protections({}, {}, runtime=runtime, host_pid_checked=None)
        assert list(seen) == list(PROVIDED[name])
        assert not any(seen[p] for p in seen if p not in ("mount_namespace", "ipc_namespace", "uts_namespace",
                                                             "pid_namespace"))  # fmt: skip


def test_oci_host_view_reports_exactly_the_container_table() -> None:
    """Run against this very process: the host's own walls are (mostly) not a sandbox's."""
    seen = oci_backend.host_view(os.getpid(), Limits(), memory_bytes=1 << 30, pids=64)
    # audit_tripwire is the runner's own report (its hook's self-test), never something the host sees
    assert list(seen) == [p for p in CONTAINER_PROTECTIONS if p is not Protection.AUDIT_TRIPWIRE]
    assert not seen[Protection.NET_NAMESPACE] and not seen[Protection.PRIVATE_ROOT]


def test_subprocess_reports_its_table() -> None:
    """A plain process that claims everything: the host believes only what it sees."""
    plain = subprocess.Popen(["sleep", "60"])
    try:
        seen = subprocess_backend.verify_protections(plain.pid, dict.fromkeys(PROTECTIONS, True))
    finally:
        plain.kill()
        plain.wait()
    assert set(SUBPROCESS_PROTECTIONS) <= set(seen) <= {*SUBPROCESS_PROTECTIONS, *ROOTLESS_PROTECTIONS}
    assert not seen[Protection.PRIVATE_ROOT] and not seen[Protection.PID_NAMESPACE]


# --- channel capabilities --------------------------------------------------------------------------------


class RecordingIO(WorkerIO):
    """A channel that takes bytes only: it states no capability, so nothing may ask more of it."""

    def __init__(self) -> None:
        self.sent = bytearray()

    def send(self, data: bytes, deadline: float | None = None) -> None:
        self.sent += data

    def poll(self, timeout: float) -> list[tuple[Stream, bytes]]:
        return []


def test_a_channel_states_its_capabilities() -> None:
    assert WorkerIO.passes_fds is False and WorkerIO.handoff is None
    assert PipeIO.passes_fds is False and SocketIO.passes_fds is True
    assert docker_backend.AttachIO.passes_fds is False
    io = RecordingIO()
    assert io.unread() == 0  # cannot tell: nothing counts as unread
    with pytest.raises(TypeError, match="cannot pass descriptors"):
        io.send_fds(b"x", [0])


def test_a_bytes_only_channel_gets_large_values_as_frames() -> None:
    big = "y" * (2 * SEALED_MIN_BYTES)
    snapshot = ContextSnapshot.from_dict({"big": big, "n": 1})
    request = ExecutionRequest(code="return 1", context=snapshot)
    io = RecordingIO()
    send_execute(io, request, snapshot, request.limits.max_message_bytes)
    assert big.encode() in bytes(io.sent)  # as bytes: the channel cannot pass a descriptor


def test_a_socket_channel_passes_large_values_as_descriptors() -> None:
    big = "z" * (2 * SEALED_MIN_BYTES)
    snapshot = ContextSnapshot.from_dict({"big": big})
    request = ExecutionRequest(code="return 1", context=snapshot)
    host, theirs = socket_channel()
    passed: list[int] = []

    class Spy(SocketIO):
        def send_fds(self, data: bytes, fds: list[int], deadline: float | None = None) -> None:
            passed.extend(fds)
            self.send(data, deadline)

    io = Spy(host, {})
    try:
        send_execute(io, request, snapshot, request.limits.max_message_bytes)
        assert len(passed) == 1
        data = os.read(theirs, 1 << 20)
        assert big.encode() not in data
    finally:
        io.close()
        os.close(theirs)
