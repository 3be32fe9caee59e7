"""`sandforge bench`: the benchmark harness of a source checkout (``python -m bench``), run as a child process
(the installed product never imports ``bench``, and an installed wheel has no such command). Results go to the
user cache unless ``--write-docs``."""

from __future__ import annotations

from pathlib import Path

import click

from sandforge.runtime.errors import UsageError

#: The checkout holding this package (``sandforge/`` beside ``bench/``), when it is one.
CHECKOUT = Path(__file__).resolve().parents[2]


def available() -> bool:
    """Whether this is a source checkout with the harness: only then is ``bench`` a command (an installed wheel
    ships no benchmark harness, and lists no command it cannot run)."""
    return (CHECKOUT / "bench" / "run.py").is_file() and (CHECKOUT / "bench" / "__main__.py").is_file()


@click.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--quick", is_flag=True, help="A few runs of each measurement (about a minute).")
@click.option("--backends", default=None, help="Comma list of backends (default: all five).")
@click.option("--write-docs", is_flag=True,
              help="Write docs/benchmarks.md, bench/results/latest.json and docs/bench-latency.png (tracked files: "
                   "never written without this flag).")  # fmt: skip
@click.option("--full", is_flag=True, help="Every table instead of the compact one.")
@click.option("--json", "as_json", is_flag=True, help="Print the run as one JSON object.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(quick: bool, backends: str | None, write_docs: bool, full: bool, as_json: bool,
            extra: tuple[str, ...]) -> None:  # fmt: skip
    """Measure latency, cold starts and throughput of every backend beside the peers; print a compact table.

    Needs a source checkout (the bench/ folder). Other options are passed to `python -m bench` (see its --help:
    --out, --plot, --peers, -n, --budget, --seconds, --workloads, ...). Exit status: the harness's.
    """
    if not available():
        raise UsageError("sandforge bench needs a source checkout (its bench/ folder is not installed)",
                         hint="git clone the repository and run it there")  # fmt: skip
    import subprocess  # here, not at the top: `sandforge --help` imports this module to ask `available()`
    import sys

    argv = [sys.executable, "-m", "bench"]
    argv += ["--quick"] if quick else []
    argv += ["--backends", backends] if backends else []
    argv += ["--write-docs"] if write_docs else []
    argv += ["--full"] if full else []
    argv += ["--json"] if as_json else []
    try:
        done = subprocess.run([*argv, *extra], cwd=CHECKOUT, check=False)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(done.returncode)
