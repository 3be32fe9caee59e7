"""Attacks on the file area (issue 41) by a program that has fully escaped the inner wall.

Two layers answer them. With the escaped runners whose tripwire is beaten too (``escaped_runner.py``, the
container boundary's bootstrap), the program is plain Python with ``os``: what it plants in ``outputs/`` (a
symlink, a hard link, a FIFO, a device, a directory) must make the run fail as a ``sandbox_violation`` with no
file returned, a race against the collector must never return what a link points at, and what it writes
outside ``outputs/`` never leaves the sandbox. With the real tripwire armed, the same moves end the run at
their first event (``os.mkfifo`` and ``os.mknod`` raise no audit event: seccomp refuses them, and the
collector would refuse what they made). Subprocess and one container backend (docker); the collector is also
attacked on its own, in this process, by a racing thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Limits, SandboxConfig, leftovers
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.ownership import process_tag
from sandforge.sandbox.protocol import ProtocolError, ResultFrame
from tests.sandbox import test_tripwire
from tests.sandbox.test_container_boundary import ESCAPED_BOOTSTRAP, container_backend
from tests.sandbox.test_tripwire import tripped

ESCAPED = Path(__file__).with_name("escaped_runner.py")
LIMITS = Limits(timeout_s=10, memory_mb=256, disk_mb=4, max_processes=12)
CSV = b"a,b\n1,2\n"
#: Made by each attack outside ``outputs/``: what a link would leak if the collector followed it.
#: The real tripwire in the escaped runner, shared with the tripwire's own tests.
armed_subprocess = test_tripwire.armed_subprocess
PLANT_SECRET = "import os, stat, threading, time\nwith open('secret', 'w') as f:\n    f.write('SECRET')\n"


@pytest.fixture(params=["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def escaped_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    if request.param == "subprocess":
        backend: Backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=ESCAPED)
    else:
        request.getfixturevalue("docker_env")
        backend = container_backend("docker", ESCAPED_BOOTSTRAP, monkeypatch)
    with contextlib.closing(backend):
        yield backend


def escaped(backend: Backend, code: str) -> ExecutionOutcome:
    worker = backend.spawn(LIMITS)
    return worker.execute(ExecutionRequest(code=PLANT_SECRET + code, limits=LIMITS, files={"data.csv": CSV}), None)


def refused(out: ExecutionOutcome) -> None:
    assert out.error_type is ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message, out.stderr)
    assert out.files == {}
    assert out.security_event is not None and out.security_event.event == "output_file"


@pytest.mark.parametrize(
    "plant",
    [
        "os.symlink(os.path.abspath('secret'), 'outputs/leak')",  # a link out of outputs/
        "os.symlink('/', 'outputs/root')",  # a link to a directory
        "os.symlink('leak', 'outputs/leak')",  # a link loop
        "os.link('secret', 'outputs/leak')",  # a hard link to a file outside outputs/
        "os.link('inputs/data.csv', 'outputs/copy')",  # a hard link to an input
        "os.mkfifo('outputs/pipe')",  # a FIFO: must neither block the collector nor pass
        "os.mknod('outputs/null', stat.S_IFCHR | 0o666, os.makedev(1, 3))",  # a device
        "os.mkdir('outputs/sub')",  # a directory: outputs/ is flat
    ],
)
def test_what_an_escaped_program_plants_in_outputs_fails_the_run(escaped_backend: Backend, plant: str) -> None:
    """Planted: the collector refuses it. Where the OS refuses to make it (seccomp forbids mknod, which a
    FIFO needs, on some backends), nothing is planted and only the program's real output comes back."""
    code = (
        f"open('outputs/fine.txt', 'w').write('ok')\ntry:\n    {plant}\nexcept OSError:\n    return 'blocked'\nreturn 1"
    )
    out = escaped(escaped_backend, code)
    if out.ok:
        assert out.value == "blocked" and out.files == {"fine.txt": b"ok"}, (plant, out.value)
        assert not plant.startswith(("os.symlink", "os.link", "os.mkdir")), "the OS allows these: not vacuous"
    else:
        refused(out)


def test_writing_outside_outputs_never_leaves_the_sandbox(escaped_backend: Backend) -> None:
    code = (
        "open('outputs/../escaped.txt', 'w').write('x')\n"
        "open('inputs/extra.txt', 'w').write('x') if os.access('inputs', os.W_OK) else None\n"
        "open('outputs/fine.txt', 'w').write('ok')\nreturn sorted(os.listdir('.'))"
    )
    out = escaped(escaped_backend, code)
    assert out.ok, (out.error_type, out.error_message)
    assert "escaped.txt" in out.value  # it was written, in the sandbox's own scratch space
    assert out.files == {"fine.txt": b"ok"}


def test_racing_the_collector_never_returns_what_a_link_points_at(escaped_backend: Backend) -> None:
    """A thread keeps swapping ``outputs/x`` between a file and a symlink to the secret while the runner
    collects: each run fails or returns the file, never the secret (the collector reads the descriptor it
    checked, opened without following links)."""
    code = (
        "link = lambda: os.symlink(os.path.abspath('secret'), 'outputs/t')\n"
        "def flip():\n    while True:\n        for make in (link, lambda: open('outputs/t', 'w').write('FILE')):\n"
        "            try:\n                make()\n                os.replace('outputs/t', 'outputs/x')\n"
        "            except OSError:\n                pass\n"
        "try:\n    threading.Thread(target=flip, daemon=True).start()\nexcept (RuntimeError, OSError):\n"
        "    return 'alone'\ntime.sleep(0.05)\nreturn 1"
    )
    for _ in range(4):
        out = escaped(escaped_backend, code)
        assert not any(b"SECRET" in body for body in out.files.values()), out.files
        if out.ok and out.value == "alone":  # no thread (seccomp, the process limit): nothing runs beside the collector
            assert out.files == {}
        elif out.ok:
            assert out.files.get("x", b"FILE") == b"FILE" and set(out.files) <= {"x", "t"}
        else:
            assert out.error_type is ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)


@pytest.mark.usefixtures("without_shared_sandboxes")
def test_no_work_directory_is_left_on_the_host(escaped_backend: Backend) -> None:
    """What the program wrote, in or outside ``outputs/``, goes with the sandbox: failed or not. (The directories
    of this process's other live backends, made before the test, are theirs to remove when they close.)"""

    def mine() -> set[Path]:
        return set(Path(leftovers.tempfile.gettempdir()).glob(f"{leftovers.WORKDIR_PREFIX}{process_tag()}-*"))

    before = mine()
    for ending in ("return 1", "raise ValueError('after writing')"):
        escaped(escaped_backend, f"open('outputs/o.txt', 'w').write('x')\n{ending}")
    escaped_backend.close()
    assert mine() - before == set()


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import os\nos.symlink('/etc/passwd', 'outputs/leak')", "os.symlink"),
        ("import os\nos.link('inputs/data.csv', 'outputs/copy')", "os.link"),
        ("open('inputs/data.csv', 'w')", "open"),  # the real open, from the program's own frame
        ("open('outputs/x.txt', 'w')", "open"),  # only the runner's open may reach outputs/
    ],
)
def test_the_armed_tripwire_ends_each_move_at_its_first_event(armed_subprocess: Backend, code: str, event: str) -> None:
    worker = armed_subprocess.spawn(LIMITS)
    out = worker.execute(ExecutionRequest(code=code, limits=LIMITS, files={"data.csv": CSV}), None)
    tripped(out, event)
    assert out.files == {}


@pytest.mark.parametrize(
    ("files", "limits"),
    [
        ([("a", 1), ("a", 1)], Limits()),
        ([("a", 1), ("b", 1)], Limits(max_files=1)),
        ([("a", 2000)], Limits(max_file_bytes=1024)),
        ([("a", 800), ("b", 800)], Limits(max_files_bytes=1024)),
    ],
)
def test_a_result_announcing_files_past_the_bounds_is_a_protocol_violation(
    files: list[tuple[str, int]], limits: Limits
) -> None:
    """The host checks what a result announces against the request's bounds before reading any of it: a
    result the runner could not have produced (a forged one) breaks the protocol."""
    from sandforge.sandbox.exchange import _accept_files

    frame = ResultFrame(type="result", status="ok", files=files)
    with pytest.raises(ProtocolError):
        _accept_files(frame, limits)
    with pytest.raises(ValueError, match="pattern"):
        ResultFrame(type="result", status="ok", files=[("../x", 1)])


@pytest.mark.parametrize(
    "plant",
    ["symlink", "hardlink", "fifo", "directory", "device", "bad_name"],
)
def test_the_collector_refuses_anything_but_a_regular_file(
    plant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's collector on its own (in this process, no sandbox around it): each kind of entry a program
    that escaped everything could leave in ``outputs/`` fails the run; a FIFO does not block it."""
    import os
    import stat

    from sandforge.sandbox.inside import files

    monkeypatch.chdir(tmp_path)
    area = files.FileArea([("data.csv", CSV)])
    (tmp_path / "secret").write_text("SECRET")
    outputs = tmp_path / "outputs"
    (outputs / "fine.txt").write_text("ok")
    if plant == "symlink":
        (outputs / "leak").symlink_to(tmp_path / "secret")
    elif plant == "hardlink":
        os.link(tmp_path / "secret", outputs / "leak")
    elif plant == "fifo":
        os.mkfifo(outputs / "pipe")
    elif plant == "directory":
        (outputs / "sub").mkdir()
    elif plant == "device":
        try:
            os.mknod(outputs / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")
    else:
        (outputs / "..x").write_text("x")
    limits = Limits().model_dump()
    collected, error = area.collect(limits)
    assert collected == []
    assert error is not None and error["type"] == "sandbox_violation", error
    assert error["security_event"]["event"] == "output_file"
    planted = next(p for p in outputs.iterdir() if p.name != "fine.txt")
    planted.rmdir() if plant == "directory" else planted.unlink()
    assert area.collect(limits) == ([("fine.txt", b"ok")], None)


def test_a_thread_racing_the_collector_never_gets_it_to_follow_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector on its own, raced by a thread of this process that swaps ``outputs/x`` between a file
    and a symlink to a secret as fast as it can: every collection returns the file or fails, never the secret."""
    import os
    import threading
    import time

    from sandforge.sandbox.inside import files

    monkeypatch.chdir(tmp_path)
    area = files.FileArea([])
    (tmp_path / "secret").write_text("SECRET")
    outputs, stop = tmp_path / "outputs", threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for make in (lambda: (outputs / "t").symlink_to(tmp_path / "secret"),
                         lambda: (outputs / "t").write_text("FILE")):  # fmt: skip
                try:
                    make()
                    os.replace(outputs / "t", outputs / "x")
                except OSError:
                    pass

    racer = threading.Thread(target=flip)
    racer.start()
    outcomes: set[str] = set()
    try:
        for _ in range(5000):  # until both were seen: the racer gets the interpreter between collections
            collected, error = area.collect(Limits().model_dump())
            assert not any(b"SECRET" in body for _, body in collected)
            outcomes.add("violation" if error is not None else "file" if collected else "empty")
            if {"violation", "file"} <= outcomes:
                break
            time.sleep(0.0002)
    finally:
        stop.set()
        racer.join()
    assert {"violation", "file"} <= outcomes  # the race was real: the collector saw the link at times


LIBRARY_OPENER = """
def read(path):
    with open(path) as f:
        return f.read()


def write(path):
    with open(path, "w") as f:
        f.write("x")
"""


@pytest.mark.parametrize(
    ("attack", "stopped"),
    [
        ("print(opener.read('inputs/data.csv'), flush=True)", False),  # what pandas.read_csv(path) does
        ("opener.write('outputs/chart.svg')", False),  # what savefig(path) does
        ("opener.write(os.path.abspath('outputs/abs.txt'))", False),
        ("opener.read('secret.txt')", True),
        ("opener.read('inputs/../secret.txt')", True),
        ("opener.read('outputs/../secret.txt')", True),
        ("opener.write('inputs/data.csv')", True),
        ("opener.write('inputs/new.csv')", True),
        ("opener.write('elsewhere.txt')", True),
    ],
)
def test_a_librarys_open_reaches_the_file_area_and_nothing_else(tmp_path: Path, attack: str, stopped: bool) -> None:
    """The armed tripwire lets library code (an environment's package, given the program's path) open exactly
    what the runner's ``open`` may: ``inputs/NAME`` to read, ``outputs/NAME`` in any mode; anything else ends
    the process with the violation status."""
    import subprocess
    import sys
    import sysconfig

    from sandforge.sandbox.inside import wire

    library = tmp_path / "lib"
    library.mkdir()
    (library / "opener.py").write_text(LIBRARY_OPENER)
    work = tmp_path / "work"
    for folder in ("inputs", "outputs"):
        (work / folder).mkdir(parents=True)
    (work / "inputs" / "data.csv").write_text("a,b")
    (work / "secret.txt").write_text("SECRET")
    inside = Path(files_module_path()).parent.parent
    script = f"""
import os, sys, sysconfig
sys.path[:0] = [{str(inside)!r}, {str(library)!r}]
from inside import tripwire
import opener
assert tripwire.install(roots=(sysconfig.get_paths()["stdlib"], {str(library)!r}))
read_end, write_end = os.pipe()
tripwire.arm(write_end, None, None, 1 << 20, ({str(work / "inputs")!r}, {str(work / "outputs")!r}))
{attack}
print("done", flush=True)
"""
    run = subprocess.run([sys.executable, "-I", "-c", script], cwd=work, capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert sysconfig.get_paths()["stdlib"]
    if stopped:
        assert run.returncode == wire.VIOLATION_EXIT_STATUS, (run.returncode, run.stdout, run.stderr)
        assert "done" not in run.stdout and "SECRET" not in run.stdout
    else:
        assert run.returncode == 0 and "done" in run.stdout, (run.returncode, run.stdout, run.stderr)


def files_module_path() -> str:
    from sandforge.sandbox.inside import files

    return files.__file__
