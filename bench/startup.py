"""What the start-up benchmarks (``bench_cli_start``, ``bench_mcp_start``) share: their flags and their JSON."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def parse_args(doc: str) -> argparse.Namespace:
    """``--runs N`` (interleaved runs of every command), ``--out FILE`` (the JSON result) and ``--base DIR``
    (another checkout of sandforge, e.g. ``git archive main | tar -x -C DIR``: its commands run as subject A,
    interleaved with this tree's as B, so a before/after pair shares one run and one load)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--base", type=Path, default=None)
    return parser.parse_args()


def tree_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` with ``tree`` first on PYTHONPATH: its ``sandforge`` is the one imported."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)}


def report(result: dict[str, Any], out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
