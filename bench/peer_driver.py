"""Runs one peer inside the peers' virtual environment and prints one JSON object on stdout.

    bench/.peers-venv/bin/python bench/peer_driver.py JOB.json

This file is executed by the peers' interpreter, never imported by sandforge: it loads the peers with
importlib and uses only the standard-library helpers of ``bench`` (loops, stats, workloads).

Job keys: ``peer`` ("llm_sandbox" | "smolagents" | "probe"), ``mode`` ("latency" | "throughput"),
``programs`` (list of {code, context_json, expected}), ``n``, ``budget_s``, ``seconds``, ``concurrency``,
``image``, ``runtime`` (Docker runtime for llm-sandbox: "runc" or "runsc").
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import loops  # after the path set-up
from bench.workloads import function_source, script


@dataclass(frozen=True)
class JobProgram:
    code: str
    context_json: str
    expected: Any


def _maxrss_mb() -> float:
    """This process image's RSS high-water mark (VmHWM; ru_maxrss would include the parent's, see script())."""
    try:
        with open("/proc/self/status") as fh:
            return int(fh.read().split("VmHWM:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llm_sandbox_runner(job: dict[str, Any]) -> loops.RunOne:
    """Fresh llm-sandbox session (one new container) per execution, on our engine and our offline image.

    Settings, each the fastest the peer allows while keeping one fresh container per execution:
    ``skip_environment_setup`` (its default set-up creates a venv and pip-upgrades, which needs the
    network), a shared Docker client, ``network_mode=none``, ``init`` so that ``stop()`` does not wait
    the 10 s SIGTERM grace of a PID 1 without a handler, and ``python3`` as the interpreter (the image
    has no ``python`` alias). The program travels embedded in the script file llm-sandbox copies in.
    """
    docker = importlib.import_module("docker")
    llm = importlib.import_module("llm_sandbox")
    client = docker.from_env()
    runtime_configs: dict[str, Any] = {
        "network_mode": "none",
        "init": True,
        "command": ["sleep", "infinity"],
    }
    if job.get("runtime") == "runsc":
        runtime_configs["runtime"] = "runsc"

    def run_one(program: JobProgram) -> loops.Result:
        code = script(program.code, context_literal=program.context_json)
        with llm.SandboxSession(
            lang="python",
            image=job["image"],
            client=client,
            keep_template=True,
            skip_environment_setup=True,
            runtime_configs=dict(runtime_configs),
        ) as session:
            session.language_handler.config.execution_commands = ["python3 {file}"]
            out = session.run(code)
        if out.exit_code:
            raise loops.Failed(f"exit {out.exit_code}: {(out.stderr or out.stdout)[-300:]}")
        data = json.loads(out.stdout)
        return loops.Result(data["value"], data["maxrss_kb"] / 1024)

    return run_one


def smolagents_runner(job: dict[str, Any]) -> loops.RunOne:
    """A fresh ``LocalPythonExecutor`` per execution; context parsed from JSON and the result dumped to
    JSON inside the timing, like every other subject. In-process: NOT a security boundary."""
    lpe = importlib.import_module("smolagents.local_python_executor")

    def run_one(program: JobProgram) -> loops.Result:
        executor = lpe.LocalPythonExecutor(additional_authorized_imports=["math"])
        executor.send_tools({})
        context = json.loads(program.context_json)
        executor.send_variables({"context": context})
        out = executor(function_source(program.code) + "_sf_value = _sf_program(context, [], {})\n_sf_value\n")
        json.dumps({"value": out.output, "context": context})
        return loops.Result(out.output, _maxrss_mb())

    return run_one


def probe() -> dict[str, Any]:
    from importlib.metadata import version

    python = sys.version.split()[0]
    return {"llm-sandbox": version("llm-sandbox"), "smolagents": version("smolagents"), "python": python}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    if job["peer"] == "probe":
        print(json.dumps(probe()))
        return 0
    runner = {"llm_sandbox": llm_sandbox_runner, "smolagents": smolagents_runner}[job["peer"]](job)
    programs = [JobProgram(p["code"], p["context_json"], p["expected"]) for p in job["programs"]]
    if job["mode"] == "throughput":
        tp = loops.throughput(runner, programs[0], seconds=job["seconds"], concurrency=job["concurrency"])
        print(json.dumps({"throughput": tp.summary()}))
        return 0
    series = loops.latency(runner, programs, n=job["n"], budget_s=job["budget_s"])
    out = {"latencies_s": series.latencies_s, "errors": series.errors, "error_samples": series.error_samples,
           "peak_mb": series.peak_mb, "extra": series.extra}  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
