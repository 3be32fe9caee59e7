"""Files in the transaction (issue 41): what 10 MB in and 10 MB out add to one execution, beside what copying
the same bytes costs on the host.

Per round, on one warm ``Sandbox`` (a fresh sandbox per execution, as always):

- ``empty``: a program that returns at once, no files;
- ``files``: the same program given a 10 MB input, which it copies to ``outputs/`` (read and written in
  1 MiB chunks), returned in the outcome;
- ``host``: the host copying a 10 MB file in and the copy out again (``shutil.copyfile`` into and out of a
  tmpfs directory, as the bytes would go into a sandbox's disk and back).

The goal (issue 41): ``files - empty`` at most 1.5x ``host``. Medians over the rounds.

    python bench/bench_files.py [--backend subprocess] [--rounds 7] [--mb 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig

COPY = """
with open("inputs/data.bin", "rb") as src, open("outputs/copy.bin", "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
return 1
"""


def host_copy(data: bytes) -> float:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base) as where:
        source, inside, back = Path(where, "src"), Path(where, "in"), Path(where, "out")
        source.write_bytes(data)
        began = time.perf_counter()
        shutil.copyfile(source, inside)
        shutil.copyfile(inside, back)
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mb", type=int, default=10)
    options = parser.parse_args()
    size = options.mb << 20
    data = os.urandom(size)
    limits = Limits(timeout_s=60, disk_mb=3 * options.mb + 8, max_file_bytes=size, max_files_bytes=size,
                    max_message_bytes=max(32 << 20, 2 * size + (1 << 20)))  # fmt: skip
    empty_s: list[float] = []
    files_s: list[float] = []
    host_s: list[float] = []
    with Sandbox(SandboxConfig(backend=options.backend, limits=limits, pool_size=1)) as sb:
        sb.execute(ExecutionRequest(code="return 1", limits=limits))  # warm
        for _ in range(options.rounds):
            began = time.perf_counter()
            out = sb.execute(ExecutionRequest(code="return 1", limits=limits))
            empty_s.append(time.perf_counter() - began)
            assert out.ok, out.error_message
            began = time.perf_counter()
            out = sb.execute(ExecutionRequest(code=COPY, limits=limits, files={"data.bin": data}))
            files_s.append(time.perf_counter() - began)
            assert out.ok and out.files["copy.bin"] == data, out.error_message
            host_s.append(host_copy(data))
    empty, files, host = (statistics.median(x) * 1000 for x in (empty_s, files_s, host_s))
    added = files - empty
    print(f"backend {options.backend}, {options.mb} MB in and out, {options.rounds} rounds (medians)")
    print(f"  empty execution   {empty:8.1f} ms")
    print(f"  with files        {files:8.1f} ms   (added {added:.1f} ms)")
    print(f"  host copy in+out  {host:8.1f} ms")
    print(f"  added / host      {added / host:8.2f}x   (goal: at most 1.5x)")


if __name__ == "__main__":
    main()
