"""Large context values reach Docker-run and runsc containers through a read-only hand-off directory.

The host side (``sandbox/handoff.py``): layout and permissions, a value linked from the process's store
rather than copied, its removal with the last snapshot, the reaping of dead processes' directories. The
runner side: the token check, and refusing what a forged host side could put there. End to end: values
arrive unchanged on every hand-off backend, fall back to frames when the directory is unusable, and leave
nothing behind.
"""

from __future__ import annotations

import gc
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig, handoff
from sandforge.sandbox.backends import docker_backend
from sandforge.sandbox.backends.docker_backend import verify_protections
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.inside import channel as inside_channel
from sandforge.sandbox.ownership import process_tag
from tests.sandbox.test_context_memfd import BIG, Traffic, forged

#: These tests list what this process leaves on the host: no shared Sandbox's warm worker may show there.
pytestmark = pytest.mark.usefixtures("without_shared_sandboxes")


def mine() -> set[Path]:
    """This process's hand-off directories (its store included)."""
    return set(handoff.base_dir().glob(f"{handoff.PREFIX}{process_tag()}-*"))


# --- the host side -----------------------------------------------------------------------------------------


def test_a_handoff_directory_is_private_outside_and_read_only_inside() -> None:
    hd = handoff.HandoffDir()
    try:
        assert stat.S_IMODE(hd.root.stat().st_mode) == 0o700  # other host users cannot reach it
        assert stat.S_IMODE(hd.path.stat().st_mode) == 0o711  # the container's user can open, not list
        assert hd.root.name.startswith(f"{handoff.PREFIX}{process_tag()}-")
        proof = hd.path / handoff.PROOF_FILE
        assert proof.read_text() == hd.token and len(hd.token) == 32
        assert stat.S_IMODE(proof.stat().st_mode) == 0o444
    finally:
        hd.remove()
    assert not hd.root.exists()


def test_a_value_is_linked_from_the_store_not_copied() -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    first, second = handoff.HandoffDir(), handoff.HandoffDir()
    try:
        first.put(0, snapshot, "big")
        second.put(3, snapshot.with_changes({"other": b"1"}), "big")  # a derived snapshot shares the file
        a, b = (first.path / "0").stat(), (second.path / "3").stat()
        assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev) and a.st_nlink == 3  # store + two links
        assert stat.S_IMODE(a.st_mode) == 0o444
        assert (first.path / "0").read_bytes() == snapshot["big"]
    finally:
        first.remove()
        second.remove()


def test_the_stored_file_goes_with_the_last_snapshot() -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    stored = snapshot.shared("big", handoff.StoredText)
    assert stored is not None and stored.path.exists()
    path = stored.path
    del snapshot, stored
    gc.collect()
    assert not path.exists()


def test_a_value_is_written_when_it_cannot_be_linked(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_link(*_: Any, **__: Any) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(handoff.os, "link", no_link)
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    hd = handoff.HandoffDir()
    try:
        hd.put(0, snapshot, "big")
        copy = hd.path / "0"
        assert copy.read_bytes() == snapshot["big"] and copy.stat().st_nlink == 1
        assert stat.S_IMODE(copy.stat().st_mode) == 0o444
        with pytest.raises(FileExistsError):  # an index is never overwritten
            hd.put(0, snapshot, "big")
    finally:
        hd.remove()


def test_reaping_removes_only_dead_processes_directories() -> None:
    base = handoff.base_dir()
    dead = base / f"{handoff.PREFIX}999999999-1-abcd"
    dead.mkdir()
    (dead / "in").mkdir()
    ours = handoff.HandoffDir()
    try:
        removed = handoff.reap()
        assert dead in removed and not dead.exists()
        assert ours.root.exists() and ours.root not in removed
    finally:
        ours.remove()
        if dead.exists():
            dead.rmdir()


def test_only_the_handoff_mount_keeps_the_private_root() -> None:
    """The Docker backend's protections: its own read-only hand-off mount is allowed, nothing else."""
    good = {"Type": "bind", "Target": handoff.MOUNT_POINT, "ReadOnly": True,
            "Source": f"/dev/shm/{handoff.PREFIX}1-2-x/in"}  # fmt: skip

    def private_root(*mounts: dict[str, Any]) -> bool:
        attrs = {"HostConfig": {"ReadonlyRootfs": True, "Mounts": list(mounts)}}
        return verify_protections(attrs, {}, runtime=None, host_pid_checked=None)["private_root"]

    assert private_root() and private_root(good)
    assert not private_root({**good, "ReadOnly": False})
    assert not private_root({**good, "Target": "/etc"})
    assert not private_root({**good, "Source": "/home/user/in"})
    assert not private_root({**good, "Type": "volume"})
    assert not private_root(good, {**good, "Source": "/"})


# --- the runner side ---------------------------------------------------------------------------------------


@pytest.fixture
def handed() -> Iterator[handoff.HandoffDir]:
    hd = handoff.HandoffDir()
    yield hd
    hd.remove()


def test_the_runner_uses_a_directory_only_with_its_token(handed: handoff.HandoffDir) -> None:
    where = str(handed.path)
    assert inside_channel.handoff_ready({"handoff_dir": where, "handoff_token": handed.token}) == where
    assert inside_channel.handoff_ready({"handoff_dir": where, "handoff_token": "0" * 32}) is None
    assert inside_channel.handoff_ready({"handoff_dir": where, "handoff_token": handed.token[:-1]}) is None
    assert inside_channel.handoff_ready({"handoff_dir": where + "-missing", "handoff_token": handed.token}) is None
    assert inside_channel.handoff_ready({"handoff_dir": where, "handoff_token": ""}) is None
    assert inside_channel.handoff_ready({}) is None


def test_the_runner_reads_handed_off_values(handed: handoff.HandoffDir) -> None:
    snapshot = ContextSnapshot.from_dict({"big": BIG})
    handed.put(0, snapshot, "big")
    got = forged({"context_keys": [["a", 1], ["big", len(snapshot["big"]), 0]]}, [], b"1", handoff=str(handed.path))
    assert not isinstance(got, Exception), got
    _frame, raw = got
    assert bytes(raw["a"]) == b"1" and raw["big"].read() == snapshot["big"]


@pytest.mark.parametrize(
    ("setup", "keys", "needle"),
    [
        ("none", [["big", 5, 0]], "cannot be opened"),  # announced, never put there
        ("file", [["big", 4, 0]], "holds 5 bytes, announced 4"),
        ("symlink", [["big", 5, 0]], "cannot be opened"),  # never followed
        ("dir", [["big", 5, 0]], "holds|cannot be"),
        ("file", [["big", 5, 16]], "which was not passed"),  # beyond the per-request maximum
        ("file", [["big", 5, 0], ["again", 5, 0]], "which was not passed"),  # one file twice
    ],
)
def test_the_runner_refuses_a_forged_handoff(tmp_path: Path, setup: str, keys: list[Any], needle: str) -> None:
    where = tmp_path / "in"
    where.mkdir()
    if setup == "file":
        (where / "0").write_bytes(b'"abc"')
    elif setup == "symlink":
        (tmp_path / "target").write_bytes(b'"abc"')
        (where / "0").symlink_to(tmp_path / "target")
    elif setup == "dir":
        (where / "0").mkdir()
    got = forged({"context_keys": keys}, [], handoff=str(where))
    assert isinstance(got, inside_channel.PassedTextError), got
    assert got.args and re.search(needle, str(got.args[0]))


def test_descriptors_are_refused_alongside_a_handoff(handed: handoff.HandoffDir) -> None:
    fd = os.memfd_create("x")
    try:
        got = forged({"context_keys": [["a", 1]]}, [fd], b"1", handoff=str(handed.path))
    finally:
        os.close(fd)
    assert isinstance(got, inside_channel.PassedTextError) and "not announced" in str(got)


# --- end to end ------------------------------------------------------------------------------------------

HANDOFF_BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor]),
    pytest.param("runsc", marks=pytest.mark.oci("runsc")),
]


@pytest.fixture(params=HANDOFF_BACKENDS)
def handoff_backend(request: pytest.FixtureRequest) -> str:
    """Each backend that hands values off (its marks make it skip, or fail when required, if unavailable)."""
    return str(request.param)


def test_handed_off_values_read_change_and_restore(handoff_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"big": BIG, "rows": list(range(20_000)), "small": 1}
    snapshot = ContextSnapshot.from_dict(values)
    before = mine()
    with Sandbox(SandboxConfig(backend=handoff_backend, pool_size=0)) as sb:
        traffic = Traffic(monkeypatch)
        code = "context['rows'].append(1)\ncontext['rows'].pop()\nreturn [context['big'][-3:], len(context['rows'])]"
        out = sb.execute(ExecutionRequest(code=code, context=snapshot))
        assert out.ok, (out.error_type, out.error_message, out.stderr)
        assert out.value == ["end", 20_000] and out.context_snapshot == snapshot
        assert traffic.bytes < 2 * len(BIG)  # neither large value went through the channel
        code = "context['big'] = context['big'][:3]\ncontext['small'] = 2\nreturn 1"
        out = sb.execute(ExecutionRequest(code=code, context=snapshot))
        assert out.ok and out.context == {**values, "big": "xxx", "small": 2}
    assert mine() <= before | {handoff._store()}  # every container's directory is gone


def test_without_the_token_values_travel_as_frames(monkeypatch: pytest.MonkeyPatch, handoff_backend: str) -> None:
    """A runner that cannot read the host's token (a remote engine, another path) gets frames."""
    original = handoff.HandoffDir.__init__
    puts: list[int] = []

    def wrong_token(self: handoff.HandoffDir) -> None:
        original(self)
        self.token = "0" * 32  # not what the directory holds

    monkeypatch.setattr(handoff.HandoffDir, "__init__", wrong_token)
    monkeypatch.setattr(handoff.HandoffDir, "put", lambda *a: puts.append(1))
    with Sandbox(SandboxConfig(backend=handoff_backend, pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return context['big'][-3:]", context={"big": BIG}))
    assert out.ok and out.value == "end" and puts == []


def test_a_value_that_cannot_be_put_travels_as_a_frame(monkeypatch: pytest.MonkeyPatch, handoff_backend: str) -> None:
    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(handoff.HandoffDir, "put", full)
    with Sandbox(SandboxConfig(backend=handoff_backend, pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return context['big'][-3:]", context={"big": BIG, "n": 1}))
    assert out.ok and out.value == "end"


def test_no_handoff_directory_without_a_local_engine(monkeypatch: pytest.MonkeyPatch, docker_env: object) -> None:
    monkeypatch.setattr(docker_backend.DockerBackend, "handoff_possible", lambda self: False)
    with Sandbox(SandboxConfig(backend="docker", pool_size=0)) as sb:
        before = mine()
        out = sb.execute(ExecutionRequest(code="return context['big'][-3:]", context={"big": BIG}))
        assert out.ok and out.value == "end"
        assert mine() == before


def test_an_engine_that_cannot_mount_the_directory_gets_frames(
    monkeypatch: pytest.MonkeyPatch, docker_env: object
) -> None:
    """A local socket whose engine does not see this machine's paths (rootless, forwarded): the engine refuses
    the bind mount; the backend stops asking for one and the values travel as frames."""
    original = handoff.HandoffDir.__init__

    def elsewhere(self: handoff.HandoffDir) -> None:
        original(self)
        self.path = self.root / "not-there"  # what the engine will not find

    monkeypatch.setattr(handoff.HandoffDir, "__init__", elsewhere)
    before = mine()
    with Sandbox(SandboxConfig(backend="docker", pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return context['big'][-3:]", context={"big": BIG}))
        assert out.ok and out.value == "end", (out.error_type, out.error_message)
        backend = sb._backend("docker")  # type: ignore[attr-defined]
        assert backend.handoff_refused and not backend.handoff_possible()
        out = sb.execute(ExecutionRequest(code="return context['big'][:3]", context={"big": BIG}))
        assert out.ok and out.value == "xxx"
    assert mine() <= before | {handoff._store()}
