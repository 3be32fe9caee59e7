"""Files in the transaction (issue 41): what 10 MB in and 10 MB out add to one execution, beside what copying
the same bytes costs on the host.

Per round, on one warm ``Sandbox`` (a fresh sandbox per execution, as always), in an order that rotates:

- ``empty``: a program that returns at once, no files;
- ``files``: the same program given a 10 MB input, which it copies to ``outputs/`` (read and written in
  1 MiB chunks), returned in the outcome;
- ``host`` (the floor): the host copying a 10 MB file in and the copy out again (``shutil.copyfile`` into
  and out of a tmpfs directory, as the bytes would go into a sandbox's disk and back);
- ``host_program`` (a second floor, printed beside): the same, plus the program's own copy between them done
  on the host the same way, since any run of that program, sandboxed or not, does it.

Each execution starts with a ready worker in the pool (``wait_ready``, untimed), as ``empty`` and ``files``
both would in use: otherwise whichever follows the other waits for the refill the first one caused.

The goal (issue 41): ``files - empty`` at most 1.5x ``host``. Medians over the rounds; the load average
is printed before and after, since the machine is shared.

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


def host_copy(data: bytes, *, program: bool = False) -> float:
    """The floor: copying ``data`` in and the copy out again on the host; with ``program``, also the
    program's own copy between them, done the same way (1 MiB reads and writes in Python)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base) as where:
        source, inside, copied, back = (Path(where, name) for name in ("src", "in", "copy", "out"))
        source.write_bytes(data)
        began = time.perf_counter()
        shutil.copyfile(source, inside)
        if program:
            with inside.open("rb") as src, copied.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            shutil.copyfile(copied, back)
        else:
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
    timings: dict[str, list[float]] = {"empty": [], "files": [], "host": [], "host_program": []}
    load_before = os.getloadavg()
    with Sandbox(SandboxConfig(backend=options.backend, limits=limits, pool_size=1)) as sb:
        pool = sb.pool(options.backend)
        sb.execute(ExecutionRequest(code="return 1", limits=limits))  # warm

        def timed_execution(code: str, files: dict[str, bytes]) -> float:
            pool.wait_ready(1, timeout=60.0)
            began = time.perf_counter()
            out = sb.execute(ExecutionRequest(code=code, limits=limits, files=files))
            spent = time.perf_counter() - began
            assert out.ok, out.error_message
            assert not files or out.files["copy.bin"] == data
            return spent

        steps = {
            "empty": lambda: timed_execution("return 1", {}),
            "files": lambda: timed_execution(COPY, {"data.bin": data}),
            "host": lambda: host_copy(data),
            "host_program": lambda: host_copy(data, program=True),
        }
        order = list(steps)
        for round_ in range(options.rounds):
            for name in order[round_ % len(order) :] + order[: round_ % len(order)]:
                timings[name].append(steps[name]())
    load_after = os.getloadavg()
    empty, files, host, host_program = (statistics.median(timings[name]) * 1000 for name in timings)
    added = files - empty
    print(f"backend {options.backend}, {options.mb} MB in and out, {options.rounds} rounds (medians)")
    print(f"  load average      {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"  empty execution   {empty:8.1f} ms")
    print(f"  with files        {files:8.1f} ms")
    print(f"  measured (added)  {added:8.1f} ms")
    print(f"  floor (host copy) {host:8.1f} ms")
    print(f"  goal (1.5x floor) {1.5 * host:8.1f} ms")
    print(f"  measured / floor  {added / host:8.2f}x   (goal: at most 1.5x)")
    print(f"  floor with the program's own copy {host_program:8.1f} ms: measured / it {added / host_program:.2f}x")


if __name__ == "__main__":
    main()
