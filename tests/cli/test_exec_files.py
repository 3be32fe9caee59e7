"""`sandforge exec --file/--files/--out` (issue 41): input files refused before any sandbox starts with one
typed line (exit 2), outputs committed all or nothing and only on ok, the default policy letting a program
open its own file area (and nothing else)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.errors import FileIOError, InputFileError
from sandforge.runtime.files.transfer import commit_output_files, input_files
from sandforge.sandbox import Limits

TRANSFORM = """
import csv
with open("inputs/data.csv") as f:
    rows = list(csv.reader(f))
with open("outputs/upper.csv", "w") as f:
    csv.writer(f).writerows([[cell.upper() for cell in row] for row in rows])
with open("outputs/count.txt", "w") as f:
    f.write(str(len(rows)))
return len(rows)
"""


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "prog.py").write_text(TRANSFORM)
    (tmp_path / "data.csv").write_text("a,b\nc,d\n")
    return tmp_path


def test_a_csv_in_gives_files_out(workdir: Path, sandbox_backend: str) -> None:
    out_dir = workdir / "out"
    code, out, err = invoke("exec", str(workdir / "prog.py"), "--backend", sandbox_backend,
                            "--file", f"data.csv={workdir / 'data.csv'}", "--out", str(out_dir))  # fmt: skip
    assert code == 0, err
    assert "ok: 2" in out
    assert sorted(p.name for p in out_dir.iterdir()) == ["count.txt", "upper.csv"]
    assert (out_dir / "upper.csv").read_bytes() == b"A,B\r\nC,D\r\n"


def test_files_dir_gives_every_file(workdir: Path) -> None:
    inputs = workdir / "in"
    inputs.mkdir()
    (inputs / "data.csv").write_text("x,y\n")
    code, out, err = invoke("exec", str(workdir / "prog.py"), "--files", str(inputs))
    assert code == 0, err
    assert "ok: 1" in out


def test_a_failed_run_writes_nothing(workdir: Path) -> None:
    program = workdir / "bad.py"
    program.write_text("open('outputs/half.csv', 'w').write('a')\nraise ValueError('after writing')")
    code, _, err = invoke("exec", str(program), "--out", str(workdir / "out"))
    assert code == 1 and "ValueError" in err
    assert not (workdir / "out").exists()
    assert sorted(p.name for p in workdir.iterdir()) == ["bad.py", "data.csv", "prog.py"]


def bad_inputs(workdir: Path) -> dict[str, tuple[list[str], str]]:
    (workdir / "link.csv").symlink_to(workdir / "data.csv")
    os.mkfifo(workdir / "fifo")
    (workdir / "big.csv").write_bytes(b"x" * (9 << 20))
    (workdir / "locked.csv").write_text("x")
    (workdir / "locked.csv").chmod(0)  # unreadable, except to root
    (workdir / "sub").mkdir()
    (workdir / "sub" / ".hidden").write_text("x")
    return {
        "bad name": (["--file", f"../x={workdir / 'data.csv'}"], "not a valid file name"),
        "absolute name": (["--file", f"/etc/x={workdir / 'data.csv'}"], "not a valid file name"),
        "no path": (["--file", "data.csv"], "expected NAME=PATH"),
        "twice": (["--file", f"d={workdir / 'data.csv'}", "--file", f"d={workdir / 'data.csv'}"], "given twice"),
        "symlink": (["--file", f"d={workdir / 'link.csv'}"], "is a symlink"),
        "fifo": (["--file", f"d={workdir / 'fifo'}"], "is a FIFO"),
        "directory": (["--file", f"d={workdir}"], "directory"),
        "missing": (["--file", f"d={workdir / 'nope'}"], "No such file"),
        "oversized": (["--file", f"d={workdir / 'big.csv'}"], "over the limit"),
        "bad name in dir": (["--files", str(workdir / "sub")], "not a valid file name"),
        **({"unreadable": (["--file", f"d={workdir / 'locked.csv'}"], "Permission denied")} if os.geteuid() else {}),
    }


def test_bad_input_is_refused_before_the_sandbox_starts(workdir: Path) -> None:
    for case, (flags, says) in bad_inputs(workdir).items():
        code, out, err = invoke("exec", str(workdir / "prog.py"), "--backend", "docker", *flags)
        # refused before any sandbox: the docker backend is never reached, so this holds without an engine
        assert code == 2, (case, code, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], (case, err)
        assert "Traceback" not in err


def test_too_many_and_too_large_in_all_are_refused() -> None:
    with pytest.raises(InputFileError, match="3 input files; the limit is 2"):
        input_files({f"f{i}": b"" for i in range(3)}, Limits(max_files=2))
    with pytest.raises(InputFileError, match="in all"):
        input_files({"a": b"x" * 600, "b": b"x" * 600}, Limits(max_files_bytes=1000))


def test_the_default_policy_lets_a_program_open_only_its_file_area(workdir: Path) -> None:
    for code_text in ("open('inputs/data.csv', 'w')", "open('notes.txt')", "open(args[0], 'w')"):
        program = workdir / "p.py"
        program.write_text(code_text)
        code, _, err = invoke("exec", str(program))
        assert code == 4 and "file_" in err, (code_text, err)  # refused by the policy: nothing ran


def test_commit_into_an_existing_directory_is_all_or_nothing(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("old")
    (out_dir / "b.txt").mkdir()  # a directory where an output would go: nothing may be written
    with pytest.raises(FileIOError, match="is a directory"):
        commit_output_files(out_dir, {"a.txt": b"new", "b.txt": b"new"})
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.txt", "keep.txt"]
    (out_dir / "b.txt").rmdir()
    commit_output_files(out_dir, {"a.txt": b"1", "keep.txt": b"2"})
    assert sorted(p.name for p in out_dir.iterdir()) == ["a.txt", "keep.txt"]
    assert (out_dir / "keep.txt").read_text() == "2"


def test_the_call_log_records_names_sizes_and_digests_never_contents(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib
    import json

    log = workdir / "calls.jsonl"
    monkeypatch.setenv("SANDFORGE_CALL_LOG", str(log))
    data = workdir / "data.csv"
    code, _, err = invoke("exec", str(workdir / "prog.py"), "--file", f"data.csv={data}", "--out", str(workdir / "o"))
    assert code == 0, err
    bad = workdir / "bad.py"
    bad.write_text("open('outputs/half.csv', 'w').write('SECRET' * 2)\nraise ValueError('no')")
    invoke("exec", str(bad), "--file", f"data.csv={data}")
    ok_record, failed_record = (json.loads(line) for line in log.read_text().splitlines())
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert ok_record["input_files"] == [{"name": "data.csv", "size": data.stat().st_size, "sha256": digest}]
    assert [f["name"] for f in ok_record["output_files"]] == ["count.txt", "upper.csv"]
    assert (
        ok_record["output_files"][1]["sha256"] == hashlib.sha256((workdir / "o" / "upper.csv").read_bytes()).hexdigest()
    )
    assert failed_record["output_files"] is None  # nothing was committed
    text = log.read_text()  # the programs' source is logged; what they wrote never is
    assert "A,B" not in text and "SECRETSECRET" not in text
