"""Files in the transaction (issue 41), on every backend: input files read-only under ``inputs/``, output
files written under ``outputs/`` and returned only by an ok run; the program's ``open`` reaches nothing else;
bounds on both sides. The attacks on the file area by a program that escaped the inner wall are in
``test_files_attacks.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox

CSV = b"city,temp\noslo,3\nlima,19\n"

TRANSFORM = """
import csv
with open("inputs/data.csv") as f:
    rows = list(csv.DictReader(f))
with open("outputs/hot.csv", "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["city", "temp_f"])
    for row in rows:
        out.writerow([row["city"].upper(), int(row["temp"]) * 9 // 5 + 32])
with open("outputs/raw.bin", "wb") as f:
    f.write(bytes(range(256)))
with open("inputs/data.csv", "rb") as f:
    size = len(f.read())
return {"rows": len(rows), "size": size}
"""


def test_a_csv_in_gives_a_csv_and_bytes_out(sandbox: Sandbox) -> None:
    out = sandbox.execute(ExecutionRequest(code=TRANSFORM, files={"data.csv": CSV}))
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == {"rows": 2, "size": len(CSV)}
    assert out.files == {"hot.csv": b"city,temp_f\r\nOSLO,37\r\nLIMA,66\r\n", "raw.bin": bytes(range(256))}


@pytest.mark.parametrize(
    "ending",
    ["raise ValueError('after writing')", "return Outcome.error('bad_input', 'refused')", "print('x' * 5000)"],
)
def test_a_failed_run_returns_no_files(sandbox: Sandbox, ending: str) -> None:
    code = "with open('outputs/half.csv', 'w') as f:\n    f.write('a,b\\n')\n" + ending
    limits = Limits(max_output_bytes=4096)
    out = sandbox.execute(ExecutionRequest(code=code, limits=limits))
    assert not out.ok
    assert out.files == {}


def test_an_empty_input_file_arrives_empty(sandbox: Sandbox) -> None:
    # the last frame has no bytes: a socket's wait for all of them once waited for a frame that never came
    code = "return [open('inputs/empty.txt').read(), open('inputs/b.txt').read()]"
    out = sandbox.execute(ExecutionRequest(code=code, files={"b.txt": b"b", "empty.txt": b""}))
    assert out.ok and out.value == ["", "b"], out.error_message


def test_no_inputs_still_gives_an_empty_inputs_directory_and_writable_outputs(sandbox: Sandbox) -> None:
    code = (
        "try:\n    open('inputs/missing.txt')\nexcept FileNotFoundError:\n    missing = True\n"
        "with open('outputs/a.txt', 'x') as f:\n    f.write('one')\n"
        "with open('outputs/a.txt', 'a') as f:\n    f.write(' two')\n"
        "with open('outputs/a.txt') as f:\n    back = f.read()\n"
        "return [missing, back]"
    )
    out = sandbox.execute(ExecutionRequest(code=code))
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == [True, "one two"]
    assert out.files == {"a.txt": b"one two"}


OPEN_SURFACE = """
tried = {}
for path, mode in args[0]:
    try:
        open(path, mode).close()
        tried[repr(path) + " " + mode] = "opened"
    except (PermissionError, FileNotFoundError, ValueError, TypeError) as exc:
        tried[repr(path) + " " + mode] = type(exc).__name__
return tried
"""


def test_the_programs_open_reaches_only_its_file_area() -> None:
    """Each path outside ``inputs/NAME`` (read) and ``outputs/NAME`` is refused by the program's ``open``
    before anything is opened (the tripwire would end the run otherwise)."""
    refused = [
        ["/etc/passwd", "r"], ["../x", "w"], ["inputs/../outputs/x", "w"], ["outputs/../x", "w"],
        ["outputs/a/b", "w"], ["outputs/.hidden", "w"], ["outputs/..", "r"], ["inputs", "r"], ["outputs/", "w"],
        ["outputs/x\u00e9", "w"], ["inputs/data.csv", "w"], ["inputs/data.csv", "r+"], ["inputs/data.csv", "a"],
        ["inputs/new.csv", "x"], ["/proc/self/fd/0", "r"], ["outputs/x", "wU"],
    ]  # fmt: skip
    allowed = [["inputs/data.csv", "r"], ["./inputs/data.csv", "rb"], ["outputs/ok.txt", "w"]]
    with Sandbox() as sb:
        out = sb.execute(ExecutionRequest(code=OPEN_SURFACE, args=[refused + allowed], files={"data.csv": CSV}))
        assert out.ok, (out.error_type, out.error_message)
        assert {k: v for k, v in out.value.items() if v == "opened"} == {f"{p!r} {m}": "opened" for p, m in allowed}
        assert set(out.value.values()) == {"opened", "PermissionError"}, out.value
        for bad in ("0", "b'inputs/data.csv'", "3.5"):  # a descriptor number, a path as bytes, not a path
            code = f"try:\n    open({bad})\nexcept PermissionError:\n    return 'refused'"
            out = sb.execute(ExecutionRequest(code=code, files={"data.csv": CSV}))
            assert out.ok and out.value == "refused", (bad, out.error_message)


@pytest.mark.parametrize(
    ("files", "limits", "says"),
    [
        ({"../etc": b"x"}, Limits(), "pattern"),
        ({"a/b": b"x"}, Limits(), "pattern"),
        ({"/abs": b"x"}, Limits(), "pattern"),
        ({".hidden": b"x"}, Limits(), "pattern"),
        ({"nul\x00": b"x"}, Limits(), "pattern"),
        ({"": b"x"}, Limits(), "pattern"),
        ({"x" * 129: b"x"}, Limits(), "pattern"),
        ({f"f{i}": b"" for i in range(3)}, Limits(max_files=2), "limits.max_files"),
        ({"big": b"x" * 2000}, Limits(max_file_bytes=1000), "limits.max_file_bytes"),
        ({"a": b"x" * 600, "b": b"x" * 600}, Limits(max_files_bytes=1000), "limits.max_files_bytes"),
        ({"a": b"x" * (4 << 20)}, Limits(disk_mb=4), "limits.disk_mb"),
    ],
)
def test_bad_input_files_are_refused_before_any_sandbox(files: dict[str, bytes], limits: Limits, says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace(".", r"\.")):
        ExecutionRequest(code="return 1", files=files, limits=limits)


@pytest.mark.parametrize(
    ("code", "limits", "says"),
    [
        ("for i in range(3):\n    open(f'outputs/f{i}', 'w').close()", Limits(max_files=2), "3 output files"),
        ("open('outputs/big', 'wb').write(b'x' * 2000)", Limits(max_file_bytes=1024), "limit per file"),
        (
            "for n in 'ab':\n    open('outputs/' + n, 'wb').write(b'x' * 700)",
            Limits(max_files_bytes=1024),
            "limit in all",
        ),
    ],
)
def test_outputs_past_a_bound_fail_the_run_with_output_limit(
    sandbox: Sandbox, code: str, limits: Limits, says: str
) -> None:
    out = sandbox.execute(ExecutionRequest(code=code + "\nreturn 1", limits=limits))
    assert out.error_type is ErrorType.OUTPUT_LIMIT, (out.error_type, out.error_message)
    assert says in (out.error_message or "")
    assert out.files == {}


def test_filling_the_disk_is_contained() -> None:
    """A program that writes until the sandbox's disk is full is stopped by its own limits (the file size
    limit, then the tmpfs's size), never by the host's disk."""
    code = (
        "written = 0\ni = 0\ntry:\n    while True:\n        with open(f'outputs/fill{i}', 'wb') as f:\n"
        "            for _ in range(8):\n                f.write(b'x' * 65536)\n                written += 65536\n"
        "        i += 1\nexcept OSError as exc:\n    return [exc.errno, written]"
    )
    limits = Limits(disk_mb=2, max_files=4096, max_file_bytes=64 << 20, max_files_bytes=64 << 20)
    with Sandbox() as sb:
        out = sb.execute(ExecutionRequest(code=code, limits=limits))
    assert out.ok, (out.error_type, out.error_message)
    errno_, written = out.value
    assert errno_ == 28  # ENOSPC: the sandbox's own disk is full
    assert written <= 2 << 20
    assert sum(len(body) for body in out.files.values()) <= 2 << 20


def test_files_round_trip_through_json() -> None:
    """A request crosses processes as JSON (the cluster's wire): its files as base64 text."""
    request = ExecutionRequest(code="return 1", files={"a.bin": bytes(range(256))})
    again = ExecutionRequest.model_validate_json(request.model_dump_json())
    assert again.files == request.files
    with pytest.raises(ValidationError, match="base64"):
        ExecutionRequest.model_validate_json('{"code": "return 1", "files": {"a": "not base64!"}}')


def test_the_python_api_takes_paths_and_gives_bytes(tmp_path: Path) -> None:
    """A request's files may be paths, read when it is built (a regular file, not a symlink); the outcome's
    are bytes by name."""
    (tmp_path / "data.csv").write_bytes(CSV)
    (tmp_path / "link.csv").symlink_to(tmp_path / "data.csv")
    with Sandbox() as sb:
        out = sb.execute(ExecutionRequest(code=TRANSFORM, files={"data.csv": tmp_path / "data.csv"}))
    assert out.ok and out.files["hot.csv"].startswith(b"city,temp_f"), (out.error_type, out.error_message)
    with pytest.raises(ValidationError, match="is a symlink; refused"):
        ExecutionRequest(code="return 1", files={"data.csv": tmp_path / "link.csv"})
    with pytest.raises(ValidationError, match="is a directory"):
        ExecutionRequest(code="return 1", files={"data.csv": tmp_path})
