"""How fast `sandforge mcp` answers ``initialize`` over stdio, beside the MCP Python SDK's own minimal server.

    .venv/bin/python bench/bench_mcp_start.py [--runs 15] [--out FILE] [--base DIR]

Each run starts the server process, writes one ``initialize`` request (protocol 2025-06-18) to its stdin and
stops the clock when the answer's line arrives: what an MCP host waits for before it can list tools. The two
servers are interleaved run by run, so both see the same load; the machine's load average is reported before
and after (on a shared machine it moves the absolute figures, less so their ratio). The baseline is an
``MCPServer`` with one tool, the smallest server of the same SDK `sandforge mcp` is built on: most of its time
is importing that SDK, a floor sandforge cannot go under. Bytecode caches are allowed (an installed package
has them), and one unmeasured run of each warms them. Goals: within 1.5x of that minimal server (issue 39,
item 2) and under 1 s on the project's machine (issue 37). ``--base DIR`` adds another checkout's ``sandforge
mcp`` (A) beside this tree's (B), run A B A B with the floor, for before/after figures from one run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.startup import parse_args, print_goals, report, tree_env

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}  # fmt: skip
MINIMAL = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("minimal")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


server.run("stdio")
'''
GOAL_S = 1.0
GOAL_RATIO = 1.5
ENTRY = "import sys; from sandforge.runtime.cli import main; sys.exit(main())"
TREE = Path(__file__).resolve().parent.parent


def answer_time(command: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds from starting ``command`` to the first line it answers to ``initialize``. ``cwd`` is an empty
    folder, so no checkout's ``sandforge/`` is imported from the working directory."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            cwd=cwd)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reply = json.loads(line)
    if "result" not in reply:
        raise RuntimeError(f"{command[0]} did not initialize: {line[:300]!r}")
    return elapsed


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 3),
        "min_s": round(ordered[0], 3),
        "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
    }


def run(runs: int, base: Path | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ANTHROPIC_API_KEY")}
    with tempfile.TemporaryDirectory(prefix="bench-mcp-start-") as tmp:
        minimal = Path(tmp) / "minimal_server.py"
        minimal.write_text(MINIMAL)
        mcp = [sys.executable, "-c", ENTRY, "mcp", "--state-dir", str(Path(tmp) / "state"), "--provider", "none",
               "--backend", "subprocess"]  # fmt: skip
        subjects = {"sdk_minimal": ([sys.executable, str(minimal)], env)}
        if base is not None:
            subjects["base_mcp"] = (mcp, tree_env(env, base.resolve()))
        subjects["sandforge_mcp"] = (mcp, tree_env(env, TREE))
        for command, subject_env in subjects.values():  # warm the bytecode caches and the page cache
            answer_time(command, subject_env, tmp)
        load_before = os.getloadavg()
        times: dict[str, list[float]] = {name: [] for name in subjects}
        for _ in range(runs):
            for name, (command, subject_env) in subjects.items():
                times[name].append(answer_time(command, subject_env, tmp))
        load_after = os.getloadavg()
    result: dict[str, Any] = {name: summary(values) for name, values in times.items()}
    floor = result["sdk_minimal"]["median_s"]
    result["goals"] = {
        name: {"measured_s": result[name]["median_s"], "floor_s": floor,
               "ratio": round(result[name]["median_s"] / floor, 2), "goal_ratio": GOAL_RATIO, "goal_s": GOAL_S,
               "met": result[name]["median_s"] <= GOAL_RATIO * floor and result[name]["median_s"] < GOAL_S}
        for name in subjects if name != "sdk_minimal"
    }  # fmt: skip
    result["ratio_median"] = result["goals"]["sandforge_mcp"]["ratio"]
    result["load_average"] = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]}
    result["cores"] = os.cpu_count()
    result["runs"] = runs
    result["goal_s"] = GOAL_S
    result["goal_met"] = result["goals"]["sandforge_mcp"]["met"]
    return result


def main() -> None:
    args = parse_args(__doc__ or "")
    result = run(args.runs, args.base)
    print_goals(result, args.runs)
    report(result, args.out)


if __name__ == "__main__":
    main()
