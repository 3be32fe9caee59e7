"""Environments in the sandbox (issue 19): what a mounted environment costs an execution, per backend.

    python -m bench.bench_env_mount --wheelhouse .wheelhouse [--rounds 40] [--backends subprocess,docker,...]
                                    [--numpy] [--json PATH]

- **warm, no import**: a warm execution (a worker from the pool, ready before the clock starts) of a program
  that does not import the environment, with a small environment (python-dateutil) mounted and without one;
  samples interleaved so load drifts hit both alike. Target: with / without <= 1.2 (p50), every backend.
- **warm, importing dateutil**: the same with ``from dateutil import parser`` and one parse (for scale).
- **cache hit**: what preparing an execution adds once the environment exists: ``EnvironmentStore.prepare``
  (a cache hit: no uv) plus the sandbox's check of the request (``check_mount``). Target: p50 <= 50 ms.
- **numpy** (``--numpy``, needs the package index): the import time of numpy inside each backend, measured by
  the program itself, against the host's interpreter importing it from the same kind of environment.

Each environment is built for the backend's own interpreter (``Sandbox.interpreter``): the host's for
subprocess, the image's for the container backends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandforge.runtime.environments import DependencyPolicy, EnvironmentStore, normalise
from sandforge.runtime.environments.target import SandboxTarget, TargetCache, interpreter_key, probe, probe_container
from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.environment import check_mount

ALLOW = ("python-dateutil", "six", "tzdata", "numpy")
TRIVIAL = "total = 0\nfor i in range(100):\n    total += i\nreturn total"
USES_DATEUTIL = "from dateutil import parser\nreturn parser.parse('2024-02-29T10:00:00').isoformat()"
IMPORT_NUMPY = "import time\nt = time.perf_counter()\nimport numpy\nreturn (time.perf_counter() - t) * 1000"
HOST_NUMPY = "import time; t = time.perf_counter(); import numpy; print((time.perf_counter() - t) * 1000)"


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _target(sandbox: Sandbox, backend: str, cache: TargetCache) -> SandboxTarget:
    found = sandbox.interpreter(backend)  # type: ignore[arg-type]
    if found.python is not None:
        python = found.python
        return cache.get(interpreter_key(python), lambda: probe(python))
    from sandforge.sandbox.docker_engine import connect

    api = connect(sandbox.config.docker_base_url)
    image, runtime = found.image, found.runtime
    assert image is not None
    return cache.get(f"image:{image}:{runtime}", lambda: probe_container(api, image, runtime=runtime))


def _mount(store: EnvironmentStore, policy: DependencyPolicy, target: SandboxTarget, names: list[str]) -> Any:
    prepared = store.prepare(normalise(names), policy, target)
    return prepared, EnvironmentMount(
        env_id=prepared.env_id, site=str(prepared.site), modules=prepared.record.top_level
    )


def _warm_ms(sandbox: Sandbox, backend: str, request: ExecutionRequest) -> float:
    """One execution from a full warm pool, timed through ``Sandbox.execute`` (the request's check included).
    The pool is refilled completely first, so no start-up of an earlier round runs during this one (each
    execution starts one refill, with or without an environment alike)."""
    pool = sandbox.pool(backend, None, request.environment)  # type: ignore[arg-type]
    pool.wait_ready(None, timeout=60)
    time.sleep(0.02)
    start = time.perf_counter()
    outcome = sandbox.execute(request, backend=backend)  # type: ignore[arg-type]
    elapsed = (time.perf_counter() - start) * 1000
    if not outcome.ok:
        raise SystemExit(f"{backend}: {outcome.error_type}: {outcome.error_message}")
    return elapsed


def warm(
    backend: str, store: EnvironmentStore, policy: DependencyPolicy, cache: TargetCache, rounds: int
) -> dict[str, Any]:
    with Sandbox(SandboxConfig(backend=backend, pool_size=2)) as sandbox:  # type: ignore[arg-type]
        _prepared, mount = _mount(store, policy, _target(sandbox, backend, cache), ["python-dateutil"])
        plain = ExecutionRequest(code=TRIVIAL)
        with_env = ExecutionRequest(code=TRIVIAL, environment=mount)
        importing = ExecutionRequest(code=USES_DATEUTIL, environment=mount)
        for request in (plain, with_env, importing):  # fill the pools, warm the caches
            _warm_ms(sandbox, backend, request)
        samples: dict[str, list[float]] = {"without_ms": [], "with_env_ms": []}
        for _ in range(rounds):  # interleaved: load drifts hit both alike
            samples["without_ms"].append(_warm_ms(sandbox, backend, plain))
            samples["with_env_ms"].append(_warm_ms(sandbox, backend, with_env))
        samples["importing_ms"] = [_warm_ms(sandbox, backend, importing) for _ in range(max(3, rounds // 4))]
    out: dict[str, Any] = {key: _p50(values) for key, values in samples.items()}
    out["ratio_p50"] = round(out["with_env_ms"] / out["without_ms"], 3)
    out["env_id"] = mount.env_id
    return out


def cache_hit(
    store: EnvironmentStore, policy: DependencyPolicy, target: SandboxTarget, n: int = 300
) -> dict[str, float]:
    manifest = normalise(["python-dateutil"])
    store.prepare(manifest, policy, target)
    prepare, check, both = [], [], []
    for _ in range(n):
        start = time.perf_counter()
        prepared = store.prepare(manifest, policy, target)
        mid = time.perf_counter()
        check_mount(
            EnvironmentMount(env_id=prepared.env_id, site=str(prepared.site), modules=prepared.record.top_level)
        )
        end = time.perf_counter()
        prepare.append((mid - start) * 1000)
        check.append((end - mid) * 1000)
        both.append((end - start) * 1000)
    return {"prepare_p50_ms": _p50(prepare), "check_mount_p50_ms": _p50(check), "added_p50_ms": _p50(both),
            "added_p95_ms": round(sorted(both)[int(n * 0.95)], 3)}  # fmt: skip


def numpy_imports(backends: list[str], work: Path, cache: TargetCache, rounds: int) -> dict[str, Any]:
    policy = DependencyPolicy(allow=("numpy",), source="index")
    store = EnvironmentStore(work / "numpy")
    out: dict[str, Any] = {}
    host_site = store.prepare(normalise(["numpy"]), policy, probe()).site
    prelude = f"import sys; sys.path.append({str(host_site)!r}); "
    host = [float(subprocess.run([sys.executable, "-I", "-S", "-B", "-c", prelude + HOST_NUMPY], check=True,
                                 capture_output=True, text=True).stdout) for _ in range(rounds)]  # fmt: skip
    out["host_ms"] = _p50(host)
    limits = Limits(memory_mb=1024, timeout_s=60)
    for backend in backends:
        with Sandbox(SandboxConfig(backend=backend, pool_size=0, limits=limits)) as sandbox:  # type: ignore[arg-type]
            _prepared, mount = _mount(store, policy, _target(sandbox, backend, cache), ["numpy"])
            samples = []
            for _ in range(rounds):
                outcome = sandbox.execute(ExecutionRequest(code=IMPORT_NUMPY, environment=mount, limits=limits))
                if not outcome.ok:
                    out[f"{backend}_error"] = f"{outcome.error_type}: {outcome.error_message}"
                    break
                samples.append(float(outcome.value))  # type: ignore[arg-type]
            if samples:
                out[f"{backend}_ms"] = _p50(samples)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheelhouse", type=Path, default=Path(".wheelhouse"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--backends", default="subprocess,docker,gvisor,runc,runsc")
    parser.add_argument("--numpy", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    backends = args.backends.split(",")
    policy = DependencyPolicy(allow=ALLOW, source="offline", wheelhouse=str(args.wheelhouse.resolve()))
    report: dict[str, Any] = {"load": os.getloadavg()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-env-mount-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        store = EnvironmentStore(work / "environments")
        cache = TargetCache(work / "targets")
        report["cache_hit"] = cache_hit(store, policy, probe())
        report["warm"] = {backend: warm(backend, store, policy, cache, args.rounds) for backend in backends}
        if args.numpy:
            report["numpy_import"] = numpy_imports(backends, work, cache, max(3, args.rounds // 8))
    report["load_after"] = os.getloadavg()[0]
    text = json.dumps(report, indent=1)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
