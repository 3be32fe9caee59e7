"""`sandforge bench`: the benchmark suite (same as `python -m bench`; options are passed through)."""

from __future__ import annotations

import sys

import click


@click.command(
    "bench",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("bench_args", nargs=-1, type=click.UNPROCESSED)
def command(bench_args: tuple[str, ...]) -> None:
    """Run the benchmarks (`sandforge bench --help` for the options; see docs/benchmarks.md)."""
    from bench.run import main as bench_main

    sys.exit(bench_main(list(bench_args)))
