"""What gets measured: our backends (in this process), the floors (plain processes) and the peers (in
their own virtual environment, through ``peer_driver.py``, so this process never imports them)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import loops
from bench.stats import Series, Throughput
from bench.workloads import Program, script

BENCH_DIR = Path(__file__).resolve().parent
PEERS_VENV = BENCH_DIR / ".peers-venv"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
DRIVER = BENCH_DIR / "peer_driver.py"
PEER_PACKAGES = ("llm-sandbox[docker]", "smolagents")


@dataclass
class Subject:
    """One column of the comparison. ``kind`` is ours | floor | peer; ``ref`` names our subject it is
    compared with (ratios are this subject's p50 over the reference's p50)."""

    key: str
    label: str
    kind: str
    ref: str | None = None
    note: str = ""
    skipped: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def latency(self, programs: Sequence[Program], *, n: int, budget_s: float) -> Series:
        raise NotImplementedError

    def throughput(self, program: Program, *, seconds: float, concurrency: int) -> Throughput:
        raise NotImplementedError

    def close(self) -> None:
        return None


# --- ours -------------------------------------------------------------------------------------------------


class Validator:
    """The guardrail validator with the default policy, when ``runtime.guardrails`` exists."""

    def __init__(self) -> None:
        self.fn: Callable[[str], Any] | None = None
        self.unavailable: str | None = None
        try:
            from sandforge.runtime.guardrails import default_policy, validate

            policy = default_policy()
            self.fn = lambda code: validate(code, policy)
        except Exception as exc:  # ImportError while it is being built, or anything it raises on load
            self.unavailable = f"runtime.guardrails not available ({type(exc).__name__}: {exc})"

    def check(self, code: str) -> None:
        if self.fn is None:
            return
        verdict = self.fn(code)
        if getattr(verdict, "verdict", "approved") != "approved":
            violations = getattr(verdict, "violations", [])
            raise loops.Failed(f"rejected by the guardrails: {violations[:1]}")


class Ours(Subject):
    """A sandforge backend through the public API, one never-reused sandbox per execution.

    ``warm``: the pool holds ``pool_size`` started sandboxes; before each timed execution the bench waits
    (untimed) until the pool is full again, so every timed call is a warm hit (checked with pool stats).
    Cold: ``pool_size=0``, every call starts its sandbox inside the timing.
    """

    def __init__(self, backend: str, *, warm: bool, validator: Validator | None = None, pool_size: int = 2) -> None:
        label = f"sandforge {backend} ({'warm pool' if warm else 'cold'})"
        super().__init__(key=f"ours_{backend}_{'warm' if warm else 'cold'}", label=label, kind="ours")
        self.backend = backend
        self.warm = warm
        self.pool_size = pool_size if warm else 0
        self.validator = validator
        self._sandbox: Any = None
        self.skipped = self._availability()

    def _availability(self) -> str | None:
        if self.backend == "subprocess":
            return None
        try:
            from sandforge.sandbox import SandboxConfig, make_backend

            backend: Any = make_backend(self.backend, SandboxConfig())  # type: ignore[arg-type]
            reason: str | None = backend.unavailable_reason()
            backend.close()
            return reason
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def sandbox(self, pool_size: int | None = None) -> Any:
        from sandforge.sandbox import Sandbox, SandboxConfig

        if self._sandbox is None:
            size = self.pool_size if pool_size is None else pool_size
            self._sandbox = Sandbox(SandboxConfig(backend=self.backend, pool_size=size))
        return self._sandbox

    def run_one(self, program: Program, *, validate: bool = False) -> loops.Result:
        from sandforge.sandbox import ExecutionRequest

        if validate and self.validator is not None:
            self.validator.check(program.code)
        context = program.snapshot if program.snapshot is not None else program.context  # encoded once per workload
        outcome = self.sandbox().execute(ExecutionRequest(code=program.code, context=context))
        if not outcome.ok:
            raise loops.Failed(f"{outcome.error_type}: {outcome.error_message}")
        return loops.Result(outcome.value, outcome.usage.peak_memory_mb or None)

    def refill(self) -> None:
        """Wait (untimed) until the warm pool is full again; nothing for a cold subject."""
        if not self.warm:
            return
        pool = self.sandbox().pool()
        if not pool.wait_ready(self.pool_size, timeout=60.0):
            raise RuntimeError(f"the {self.backend} pool did not refill within 60 s: {pool.last_error}")

    def latency(self, programs: Sequence[Program], *, n: int, budget_s: float, validate: bool = False) -> Series:
        sb = self.sandbox()
        before = self.refill if self.warm else None
        self.refill()
        warmup_error = None
        try:  # once per cell, untimed (as in loops.latency): connecting to the engine is not a per-call cost
            self.run_one(programs[0], validate=validate)
        except Exception as exc:
            warmup_error = f"warm-up failed: {type(exc).__name__}: {exc}"[:300]
        self.refill()
        pool = sb.pool()
        hits0, cold0 = pool.stats["warm_hits"], pool.stats["cold_starts"]
        series = loops.latency(lambda p: self.run_one(p, validate=validate), programs, n=n, budget_s=budget_s,
                               before=before, warmup=0)  # fmt: skip
        if warmup_error:
            series.extra["warmup_error"] = warmup_error
        series.extra["warm_hits"] = pool.stats["warm_hits"] - hits0
        series.extra["cold_starts"] = pool.stats["cold_starts"] - cold0
        return series

    def throughput(self, program: Program, *, seconds: float, concurrency: int) -> Throughput:
        """A separate sandbox whose pool is as large as the concurrency, filled before the clock starts."""
        from sandforge.sandbox import Sandbox, SandboxConfig

        size = concurrency if self.warm else 0
        with Sandbox(SandboxConfig(backend=self.backend, pool_size=size)) as sb:
            if size:
                sb.pool().wait_ready(size, timeout=120.0)
            saved, self._sandbox = self._sandbox, sb
            try:
                tp = loops.throughput(self.run_one, program, seconds=seconds, concurrency=concurrency)
            finally:
                self._sandbox = saved
            stats = sb.pool().stats
            tp.extra = {"warm_hits": stats["warm_hits"], "cold_starts": stats["cold_starts"], "pool_size": size}
        return tp

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


# --- floors -----------------------------------------------------------------------------------------------


def real_python() -> str:
    """This interpreter's real binary (not a venv or pyenv shim): the same CPython our subprocess backend runs."""
    return os.path.realpath(sys.executable)


def _parse_script_output(out: bytes, err: bytes, code: int) -> loops.Result:
    if code != 0:
        raise loops.Failed(f"exit {code}: {err.decode(errors='replace')[-300:]}")
    data = json.loads(out)
    return loops.Result(data["value"], data["maxrss_kb"] / 1024)


class CommandFloor(Subject):
    """A fresh process (or container) per execution running the program as a plain script; the context
    goes in on stdin. Nothing is pre-started, nothing is reused."""

    def __init__(self, key: str, label: str, argv_prefix: list[str], ref: str, note: str = "") -> None:
        super().__init__(key=key, label=label, kind="floor", ref=ref, note=note)
        self.argv_prefix = argv_prefix

    def run_one(self, program: Program) -> loops.Result:
        proc = subprocess.run(
            [*self.argv_prefix, script(program.code)],
            input=program.context_json.encode(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        return _parse_script_output(proc.stdout, proc.stderr, proc.returncode)

    def latency(self, programs: Sequence[Program], *, n: int, budget_s: float) -> Series:
        return loops.latency(self.run_one, programs, n=n, budget_s=budget_s)

    def throughput(self, program: Program, *, seconds: float, concurrency: int) -> Throughput:
        return loops.throughput(self.run_one, program, seconds=seconds, concurrency=concurrency)


#: The distribution's python3, preferred for the floor: the project's pyenv interpreter spends ~20 ms more
#: per start-up in site-packages (.pth files), which would flatter us. (Our runner starts with -S anyway.)
SYSTEM_PYTHON = "/usr/bin/python3"


def python_floor() -> CommandFloor:
    py = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else real_python()
    version = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
    return CommandFloor(
        "python3_I_c",
        "python3 -I -c (floor)",
        [py, "-I", "-c"],
        ref="ours_subprocess_warm",
        note=f"{py} (Python {version}); no sandbox at all",
    )


def docker_run_floor(runtime: str, image: str | None, skipped: str | None) -> CommandFloor:
    argv = ["docker", "run", "--rm", "-i", "--network", "none"]
    if runtime == "runsc":
        argv += ["--runtime", "runsc"]
    floor = CommandFloor(
        f"docker_run_{runtime}",
        f"docker run --rm {runtime} (floor)",
        [*argv, image or "missing-image", "python3", "-I", "-c"],
        ref="ours_gvisor_warm" if runtime == "runsc" else "ours_docker_warm",
        note="docker CLI, --network none, the same image, no other limits",
    )
    floor.skipped = skipped
    return floor


# --- peers ------------------------------------------------------------------------------------------------


def peers_status() -> tuple[dict[str, str] | None, str | None]:
    """Versions of the peers in their venv, or why they cannot run."""
    if not PEERS_PYTHON.exists():
        return None, f"peers venv absent ({PEERS_VENV.relative_to(BENCH_DIR.parent)}; run `make bench-peers`)"
    try:
        out = _drive({"peer": "probe"}, timeout=120)
    except Exception as exc:
        return None, f"peers venv unusable: {exc}"
    return {str(k): str(v) for k, v in out.items()}, None


def ensure_peers_venv(log: Callable[[str], None]) -> None:
    """Create the peers' venv with the project's interpreter and install the peers from the package index."""
    if PEERS_PYTHON.exists():
        return
    log(f"creating {PEERS_VENV} and installing {', '.join(PEER_PACKAGES)} (once)")
    subprocess.run([real_python(), "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(PEERS_PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(PEERS_PYTHON), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)


def _drive(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="sandforge-bench-job-", delete=False) as fh:
        json.dump(job, fh)
        path = fh.name
    try:
        proc = subprocess.run([str(PEERS_PYTHON), str(DRIVER), path], capture_output=True, timeout=timeout, check=False)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace")[-800:]
        raise RuntimeError(f"peer driver failed (exit {proc.returncode}): {detail}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


def _job_programs(programs: Sequence[Program]) -> list[dict[str, Any]]:
    return [{"code": p.code, "context_json": p.context_json, "expected": p.expected} for p in programs]


class Peer(Subject):
    """A peer library driven in its own venv; the driver does the timing with the same loops as ours.

    ``processes`` > 1 runs that many drivers side by side for throughput (an in-process executor is bound
    to one core by the GIL; separate processes give it all cores, as a real deployment would).
    """

    def __init__(self, key: str, label: str, peer: str, *, ref: str, note: str, runtime: str | None = None,
                 image: str | None = None, processes_for_throughput: int = 1) -> None:  # fmt: skip
        super().__init__(key=key, label=label, kind="peer", ref=ref, note=note)
        self.peer = peer
        self.runtime = runtime
        self.image = image
        self.processes = processes_for_throughput

    def _job(self, **fields: Any) -> dict[str, Any]:
        return {"peer": self.peer, "runtime": self.runtime, "image": self.image, **fields}

    def latency(self, programs: Sequence[Program], *, n: int, budget_s: float) -> Series:
        job = self._job(mode="latency", programs=_job_programs(programs), n=n, budget_s=budget_s)
        return Series.from_dict(_drive(job, timeout=budget_s * 3 + 300))

    def throughput(self, program: Program, *, seconds: float, concurrency: int) -> Throughput:
        per_process = max(1, concurrency // self.processes)
        job = self._job(mode="throughput", programs=_job_programs([program]), seconds=seconds,
                        concurrency=per_process)  # fmt: skip
        results: list[dict[str, Any]] = []
        errors: list[BaseException] = []

        def one() -> None:
            try:
                results.append(_drive(job, timeout=seconds * 3 + 300)["throughput"])
            except BaseException as exc:
                errors.append(exc)

        import threading

        t0 = time.monotonic()
        threads = [threading.Thread(target=one) for _ in range(self.processes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(str(errors[0]))
        total = Throughput(concurrency=per_process * self.processes)
        total.completed = sum(int(r["completed"]) for r in results)
        total.errors = sum(int(r["errors"]) for r in results)
        # each driver timed its own window (start-up of the interpreter and imports excluded)
        total.wall_s = max(float(r["wall_s"]) for r in results) if results else time.monotonic() - t0
        total.error_samples = [s for r in results for s in r.get("error_samples", [])][:3]
        return total
