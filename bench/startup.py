"""What the start-up benchmarks (``bench_cli_start``, ``bench_mcp_start``) share: their flags and their JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parse_args(doc: str) -> argparse.Namespace:
    """``--runs N`` (interleaved runs of every command) and ``--out FILE`` (the JSON result)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def report(result: dict[str, Any], out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
