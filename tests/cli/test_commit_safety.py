"""`exec --commit` as a file writer: no lost update, mode/owner/symlinks kept, typed errors on full or
read-only file systems, and the original always intact (issue 14, items 2 and 3)."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.errors import FileIOError
from sandforge.runtime.files import write_user_file
from sandforge.runtime.files.locks import lock_path_for

COUNTER = "context['n'] = context.get('n', 0) + 1\nreturn context['n']\n"
SANDFORGE = Path(sys.executable).parent / "sandforge"
IS_ROOT = os.geteuid() == 0


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def commit(program: Path, ctx: Path, *extra: str) -> tuple[int, str, str]:
    return invoke("exec", str(program), "--context", str(ctx), "--commit", *extra)


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    path = tmp_path / "counter.py"
    path.write_text(COUNTER)
    return path


# --- item 2: concurrent commits ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # twenty CLI start-ups, serialised, on a shared 2-core machine
def test_twenty_concurrent_commits_lose_no_update(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 0}')
    env = {**os.environ, "SANDFORGE_BACKEND": "subprocess", "SANDFORGE_LOCK_TIMEOUT": "850"}
    procs = [
        subprocess.Popen(
            [str(SANDFORGE), "exec", str(counter), "--context", str(ctx), "--commit", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(20)
    ]
    results = [(p.wait(timeout=600), p.stdout.read() if p.stdout else b"", p.stderr.read() if p.stderr else b"")
               for p in procs]  # fmt: skip
    assert [code for code, _, _ in results] == [0] * 20, [err for _, _, err in results]
    values = sorted(json.loads(out)["value"] for _, out, _ in results)
    assert values == list(range(1, 21))  # each run saw the previous run's commit
    assert json.loads(ctx.read_text()) == {"n": 20}


def test_the_lock_is_held_while_the_context_is_read(tmp_path: Path, counter: Path) -> None:
    """A run that cannot get the lock in time reads nothing, runs nothing and writes nothing (exit 7)."""
    from filelock import FileLock

    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 7}')
    with FileLock(lock_path_for(ctx)):
        result = CliRunner(env={"SANDFORGE_LOCK_TIMEOUT": "0.2"}).invoke(
            main, ["exec", str(counter), "--context", str(ctx), "--commit"]
        )
    assert result.exit_code == 7, result.output
    assert "locked by another sandforge process" in result.stderr and len(result.stderr.splitlines()) == 1
    assert json.loads(ctx.read_text()) == {"n": 7}


def test_two_symlinks_to_one_context_share_one_lock(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "a.json").symlink_to(target)
    (tmp_path / "b.json").symlink_to("real.json")
    assert lock_path_for(tmp_path / "a.json") == lock_path_for(tmp_path / "b.json") == tmp_path / ".real.json.lock"


# --- item 3: modes, owners, symlinks --------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_commit_keeps_the_mode(tmp_path: Path, counter: Path, mode: int) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 1}')
    ctx.chmod(mode)
    code, _, err = commit(counter, ctx)
    assert code == 0, err
    assert json.loads(ctx.read_text()) == {"n": 2}
    assert stat.S_IMODE(ctx.stat().st_mode) == mode


def test_a_new_context_file_is_private(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "new" / "deeper" / "ctx.json"
    code, _, err = commit(counter, ctx)
    assert code == 0, err
    assert stat.S_IMODE(ctx.stat().st_mode) == 0o600
    assert stat.S_IMODE(ctx.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(ctx.parent.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(lock_path_for(ctx).stat().st_mode) == 0o600


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_commit_keeps_the_owner(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 1}')
    os.chown(ctx, 4321, 4322)
    ctx.chmod(0o600)
    code, _, err = commit(counter, ctx)
    assert code == 0, err
    st = ctx.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4321, 4322, 0o600)


def test_a_symlinked_context_is_written_through_to_its_target(tmp_path: Path, counter: Path) -> None:
    real = tmp_path / "store" / "real.json"
    real.parent.mkdir()
    real.write_text('{"n": 41}')
    real.chmod(0o640)
    link = tmp_path / "ctx.json"
    link.symlink_to(real)
    code, _, err = commit(counter, link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text()) == {"n": 42}
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert not [p for p in real.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_committed_context_is_compact(tmp_path: Path) -> None:
    program = tmp_path / "deep.py"
    program.write_text("v = 1\nfor _ in range(150):\n    v = [v]\ncontext['deep'] = v\nreturn 1\n")
    ctx = tmp_path / "ctx.json"
    code, _, err = commit(program, ctx)
    assert code == 0, err
    text = ctx.read_text()
    assert text == json.dumps({"deep": json.loads(text)["deep"]}, separators=(",", ":")) + "\n"
    assert len(text) == len('{"deep":') + 150 * 2 + 1 + 2  # no indentation growing with depth


# --- item 3: full, read-only and forbidden file systems ------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_a_full_file_system_is_one_line_and_the_original_stays(tiny_tmpfs: Path, tmp_path: Path) -> None:
    program = tmp_path / "grow.py"
    program.write_text("context['big'] = 'x' * 60000\nreturn 1\n")
    ctx = tiny_tmpfs / "ctx.json"
    original = json.dumps({"pad": "y" * 30000}).encode()
    ctx.write_bytes(original)
    code, _, err = commit(program, ctx)
    assert code == 7
    assert "No space left on device (ENOSPC)" in _one_error_line(err)
    assert ctx.read_bytes() == original
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == [".ctx.json.lock", "ctx.json"]  # no temp file


def test_a_read_only_file_system_is_one_line_and_nothing_runs(tiny_tmpfs: Path, counter: Path) -> None:
    ctx = tiny_tmpfs / "ctx.json"
    ctx.write_text('{"n": 1}')
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    code, _, err = commit(counter, ctx)
    assert code == 7
    assert "Read-only file system (EROFS)" in _one_error_line(err)
    assert json.loads(ctx.read_text()) == {"n": 1}


@pytest.mark.parametrize(
    ("failing", "number"), [("fsync", errno.EIO), ("write", errno.ENOSPC), ("replace", errno.EACCES)]
)
def test_every_os_error_of_a_write_is_typed_and_leaves_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str, number: int
) -> None:
    target = tmp_path / "ctx.json"
    target.write_bytes(b'{"old": true}')
    target.chmod(0o640)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(FileIOError) as info:
        write_user_file(target, b'{"new": true}')
    monkeypatch.undo()
    assert info.value.exit_code == 7
    assert errno.errorcode[number] in str(info.value) and "\n" not in str(info.value)
    assert target.read_bytes() == b'{"old": true}' and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["ctx.json"]


@pytest.mark.skipif(IS_ROOT, reason="root ignores directory permissions")
def test_an_unwritable_directory_is_one_line(tmp_path: Path, counter: Path) -> None:
    ctx = tmp_path / "ro" / "ctx.json"
    ctx.parent.mkdir()
    ctx.write_text('{"n": 1}')
    ctx.parent.chmod(0o500)
    try:
        code, _, err = commit(counter, ctx)
    finally:
        ctx.parent.chmod(0o700)
    assert code == 7 and "Permission denied (EACCES)" in _one_error_line(err)
    assert json.loads(ctx.read_text()) == {"n": 1}
