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


def print_goals(result: dict[str, Any], runs: int) -> None:
    """The load average, then one line per goal: measured / floor / ratio / goal (and the absolute bound)."""
    load = result["load_average"]
    print(f"load average {load['before']} -> {load['after']} on {result['cores']} cores, {runs} runs, medians")
    print(f"{'goal':<14} {'measured':>10} {'floor':>10} {'ratio':>7} {'goal':>13}  met")
    for name, goal in result["goals"].items():
        aim = f"{goal['goal_ratio']}x" + (f", <{goal['goal_s']:.0f} s" if "goal_s" in goal else "")
        print(f"{name:<14} {goal['measured_s'] * 1000:>8.1f}ms {goal['floor_s'] * 1000:>8.1f}ms "
              f"{goal['ratio']:>6.2f}x {aim:>13}  {'yes' if goal['met'] else 'NO'}")  # fmt: skip
