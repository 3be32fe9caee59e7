"""The suite's slowest test files, so the longest run first under xdist (tests/conftest.py orders by them).

With ``-n N`` a file of long tests collected last leaves one worker running it while the others are idle; run
first, its time overlaps everything else. Whole files are moved, never single tests, so a module-scoped
fixture (a Ray cluster, a server) is still set up once per worker. ``durations.json`` holds seconds per file,
summed over setup, call and teardown from a full run's ``--durations`` report; files it does not list keep their
collection order after the listed ones. A stale file only costs speed, never a test.

Refresh it from a full run: ``python -m tests.durations LOG > tests/durations.json``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PATH = Path(__file__).with_name("durations.json")
_LINE = re.compile(r"^\s*(?P<seconds>\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(?P<nodeid>\S.*)$")


def load() -> dict[str, float]:
    """Seconds per test file (its path from the repository's top), or nothing when the file is absent or bad."""
    try:
        data = json.loads(PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def from_report(text: str) -> dict[str, float]:
    """Seconds per file from the lines of pytest's ``--durations`` report in ``text``."""
    per_file: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            per_file[match["nodeid"].split("::", 1)[0]] += float(match["seconds"])
    return {name: round(seconds, 1) for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])}


def one_worker(item: pytest.Item) -> bool:
    """Whether the tests of the item's file must all go to one xdist worker: a module-scoped set-up is made
    once there, and a file that runs whole in a network namespace (``tests/egress/netns.py``) runs it once
    there, where split across workers every other worker given one of its tests waits on that run's lock."""
    return shares_a_setup(item) or item.get_closest_marker("netns") is not None


def keep_xdist_groups(items: list[pytest.Item]) -> None:
    """Make the group name xdist gives a test (``--dist loadgroup``: ``NODEID@GROUP``, in ``item._nodeid``) its
    node id. pytest 9 reads ``nodeid`` from a structured ``_id`` that xdist 3.8 does not set, so its scheduler
    saw every test as a group of its own: a file's module-scoped set-up (a Ray cluster, a server) was made on
    every worker given one of its tests, and again each time a worker came back to the file."""
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9; before it, ``nodeid`` is ``_nodeid`` itself
    except ImportError:
        return
    for item in items:
        grouped = item.__dict__.get("_nodeid")
        if isinstance(grouped, str) and grouped != item.nodeid:
            item._id = NodeId.parse(grouped)  # type: ignore[attr-defined]  # its string form is ``grouped`` itself


def without_group(nodeid: str) -> str:
    """A node id without the ``@GROUP`` suffix xdist's loadgroup adds (``keep_xdist_groups``)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def shares_a_setup(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of module, class or package scope that its own file or a conftest of
    the suite defines (the plugins' own, such as anyio's backend, are cheap)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for definitions in info.name2fixturedefs.values():
        for fixturedef in definitions:
            if fixturedef.scope in ("module", "class", "package") and _ours(fixturedef.baseid):
                return True
    return False


def _ours(baseid: str) -> bool:
    return baseid.startswith(("tests", "policies"))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.durations PYTEST_LOG > tests/durations.json", file=sys.stderr)
        return 2
    try:
        text = Path(argv[0]).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        print(f"durations: cannot read {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 2
    print(json.dumps(from_report(text), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
