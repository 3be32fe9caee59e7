"""How fast the ``sandforge`` command starts (issue 39, item 1), beside the floors it is measured against.

    .venv/bin/python bench/bench_cli_start.py [--runs 15] [--out FILE] [--base DIR]

Each run starts a fresh interpreter the way the installed ``sandforge`` script does (``from
sandforge.runtime.cli import main; main()``) and waits for it to exit. Goals:

- ``--version`` and ``--help``: at most 2x ``python -I -c "import click"`` (an interpreter and click: the
  least a click command line can cost);
- ``exec`` of ``return 1 + 1`` on the subprocess backend, end to end: at most 2x the sum of ``python -I -c
  "import pydantic"`` and the subprocess backend's cold start as ``sandforge doctor`` reports it
  (``probe_backend``'s ``cold_ms``: a sandbox started, one program run). ``import pydantic`` is lazy: defining a
  model loads pydantic's schema machinery (2-2.5x that import's CPU), which every command with a model at its
  boundary pays, so the row ``exec_one_model`` (information, not in the exit status) puts ``exec`` beside the
  floor proposed instead: an interpreter that defines one pydantic model, plus the same cold start.

Commands and floors are interleaved run by run, so all see the same load; the load average is printed before
and after. Bytecode caches are written and used (an installed package has them: PYTHONDONTWRITEBYTECODE is
removed from the children's environment) and one unmeasured run of each warms them. ``config`` is timed for
information. ``--base DIR`` adds another checkout's ``--version``, ``--help`` and ``exec`` (A, rows ``*_base``)
beside this tree's (B), interleaved with them and the floors, for before/after figures from one run. Exit
status 1 when a goal of this tree is missed.
"""

from __future__ import annotations

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

ENTRY = "import sys; from sandforge.runtime.cli import main; sys.exit(main())"
GOAL_RATIO = 2.0
#: The proposed floor's program: one pydantic model defined (issue 39, item 1, third pass).
ONE_MODEL = "from pydantic import BaseModel\nclass One(BaseModel):\n    x: int = 0"
TREE = Path(__file__).resolve().parent.parent


def wall(command: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds from starting ``command`` in ``cwd`` to its exit (it must succeed). ``cwd`` is an empty folder:
    ``python -c`` puts the working directory first on sys.path, and a checkout's own ``sandforge/`` there would
    be measured instead of the one PYTHONPATH or the install names."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def doctor_cold_s() -> float:
    """The subprocess backend's cold start as ``sandforge doctor`` reports it."""
    from sandforge.runtime.cli.doctor_cmd import probe_backend
    from sandforge.sandbox import SandboxConfig

    return float(probe_backend("subprocess", SandboxConfig.from_env())["cold_ms"]) / 1000


def run(runs: int, base: Path | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ANTHROPIC_API_KEY")}
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-cli-start-") as tmp:
        program = Path(tmp) / "two.py"
        program.write_text("return 1 + 1\n")
        env["SANDFORGE_STATE_DIR"] = str(Path(tmp) / "state")
        ours = tree_env(env, TREE)
        measured = {"version": ["--version"], "help": ["--help"], "config": ["config"],
                    "exec": ["exec", "--backend", "subprocess", str(program)]}  # fmt: skip
        commands = {
            "click_floor": ([py, "-I", "-c", "import click"], env),
            "pydantic_floor": ([py, "-I", "-c", "import pydantic"], env),
            "one_model_floor": ([py, "-I", "-c", ONE_MODEL], env),
        }
        for name, args in measured.items():
            if base is not None and name != "config":
                commands[f"{name}_base"] = ([py, "-c", ENTRY, *args], tree_env(env, base.resolve()))
            commands[name] = ([py, "-c", ENTRY, *args], ours)
        for command, subject_env in commands.values():  # write and warm the bytecode caches and the page cache
            wall(command, subject_env, tmp)
        doctor_cold_s()
        load_before = os.getloadavg()
        times: dict[str, list[float]] = {name: [] for name in [*commands, "doctor_cold"]}
        for _ in range(runs):
            for name, (command, subject_env) in commands.items():
                times[name].append(wall(command, subject_env, tmp))
            times["doctor_cold"].append(doctor_cold_s())
        load_after = os.getloadavg()
    med = {name: statistics.median(values) for name, values in times.items()}
    exec_floor = med["pydantic_floor"] + med["doctor_cold"]
    floors = {"version": med["click_floor"], "help": med["click_floor"], "exec": exec_floor}
    goals = {name: (med[name], floor) for name, floor in floors.items()}
    goals.update({f"{name}_base": (med[f"{name}_base"], floor) for name, floor in floors.items() if base is not None})
    goals["exec_one_model"] = (med["exec"], med["one_model_floor"] + med["doctor_cold"])  # information
    return {
        "median_s": {name: round(value, 4) for name, value in med.items()},
        "min_s": {name: round(min(values), 4) for name, values in times.items()},
        "goals": {
            name: {
                "measured_s": round(m, 4),
                "floor_s": round(f, 4),
                "ratio": round(m / f, 2),
                "goal_ratio": GOAL_RATIO,
                "met": m <= GOAL_RATIO * f,
            }
            for name, (m, f) in goals.items()
        },
        "runs": runs,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "cores": os.cpu_count(),
        "bytecode_cached": True,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    result = run(args.runs, args.base)
    print_goals(result, args.runs)
    med = result["median_s"]
    print(
        f"(floors: click {med['click_floor'] * 1000:.1f} ms; pydantic {med['pydantic_floor'] * 1000:.1f} ms + doctor "
        f"cold start {med['doctor_cold'] * 1000:.1f} ms; one model {med['one_model_floor'] * 1000:.1f} ms; config "
        f"{med['config'] * 1000:.1f} ms)"
    )
    report(result, args.out)
    official = [goal for name, goal in result["goals"].items() if not name.endswith(("_base", "_one_model"))]
    sys.exit(0 if all(goal["met"] for goal in official) else 1)


if __name__ == "__main__":
    main()
