"""Progress on long work (image build, benchmarks): a ``rich`` spinner with the current step and the time spent
when standard error is a terminal, plain ``  step`` lines when it is not (a log, CI), nothing with ``quiet``.
``rich`` honours ``NO_COLOR`` and ``TERM=dumb``; it is imported only for a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

import click


def interactive() -> bool:
    """Whether progress may redraw: standard error is a terminal."""
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


class Steps:
    """``with Steps("image build") as steps: work(progress=steps.step)``: each ``step(message)`` is shown as the
    current step (a terminal) or printed as one line (anything else)."""

    def __init__(self, title: str, *, quiet: bool = False) -> None:
        self.title = title
        self.quiet = quiet
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Steps:
        if not self.quiet and interactive():
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)  # fmt: skip
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=None)
        return self

    def step(self, message: str) -> None:
        if self.quiet:
            return
        if self._progress is None:
            click.echo(f"  {message}", err=True)
            return
        self._progress.console.print(f"  {message}", highlight=False, markup=False)
        self._progress.update(self._task, description=f"{self.title}: {message}")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


def notices(title: str) -> Callable[[str], None]:
    """A progress callback for work that happens only sometimes (a program's environment built on its first
    run): each step one line on standard error, ``sandforge: TITLE: step``; nothing at all when nothing is built.
    (A spinner would start for every run, built or not.)"""

    def notice(message: str) -> None:
        click.echo(f"sandforge: {title}: {message}", err=True)

    return notice
