"""Environments (issue 19): build times, the cost of a cache hit, the disk a second environment adds, and
the import time of numpy inside the container backends against the host's.

    python bench/bench_envs.py --wheelhouse .wheelhouse [--rounds 5] [--no-numpy] [--no-docker]

Builds of {python-dateutil, beautifulsoup4}: "cold" is a new uv cache fed from the wheelhouse (offline);
"warm" is a new environment (a fresh envs directory) over a uv cache that already holds the wheels.
numpy comes from the package index (a few MB download once per run). The container runs mount the
environment read-only at /sandforge/env with `docker run` (network none, read-only root, uid 65534), as the
backends will once they are wired; the host runs the same interpreter command with the site on sys.path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandforge.runtime.environments import DependencyPolicy, EnvironmentStore, normalise, probe
from sandforge.runtime.environments.records import MOUNT_PATH
from sandforge.runtime.environments.target import PROBE_ARGV, SandboxTarget, parse_probe

ALLOW = ("python-dateutil", "beautifulsoup4", "soupsieve", "six", "tzdata", "typing-extensions", "numpy")
SMALL = normalise(["python-dateutil", "beautifulsoup4"])
IMPORT_NUMPY = "import time; t = time.perf_counter(); import numpy; print((time.perf_counter() - t) * 1000)"


def _p50(values: list[float]) -> float:
    return statistics.median(values)


def _disk(root: Path) -> int:
    """Bytes on disk below root, each inode counted once (hard links are shared bytes)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def builds(work: Path, policy: DependencyPolicy, target: SandboxTarget, rounds: int) -> dict[str, Any]:
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    shared = work / "shared-cache"
    for i in range(rounds):
        for kind, samples, cache in (("cold", cold, None), ("warm", warm, shared)):
            if kind == "warm" and i == 0:  # fill the shared cache once
                EnvironmentStore(work / "fill", cache_dir=shared).prepare(SMALL, policy, target)
            root = work / f"{kind}-{i}"
            start = time.perf_counter()
            prepared = EnvironmentStore(root, cache_dir=cache).prepare(SMALL, policy, target)
            total = (time.perf_counter() - start) * 1000
            r = prepared.record
            samples.append({"total_ms": total, "resolve_ms": r.resolve_ms, "install_ms": r.install_ms,
                            "compile_ms": r.compile_ms})  # fmt: skip
    return {kind: {key: _p50([s[key] for s in samples]) for key in samples[0]} for kind, samples in
            (("cold_wheelhouse", cold), ("warm_cache", warm))}  # fmt: skip


def cache_hits(work: Path, policy: DependencyPolicy, target: SandboxTarget, n: int = 300) -> dict[str, float]:
    root = work / "hits"
    EnvironmentStore(root).prepare(SMALL, policy, target)
    same_store, new_store = [], []
    store = EnvironmentStore(root)
    for _ in range(n):
        start = time.perf_counter()
        store.prepare(SMALL, policy, target)
        same_store.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        EnvironmentStore(root).prepare(SMALL, policy, target)
        new_store.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": _p50(same_store), "p95_ms": sorted(same_store)[int(n * 0.95)],
            "p50_new_store_ms": _p50(new_store)}  # fmt: skip


def disk(work: Path, policy: DependencyPolicy, target: SandboxTarget) -> dict[str, int]:
    """What a second environment adds on disk: one sharing a package with the first (its new packages enter
    the uv cache once, and the environment links them), and a twin: the very same wheels for another sandbox
    interpreter (the image's 3.11.2 beside the host's), whose only bytes of its own are bytecode and records."""
    root = work / "disk"
    store = EnvironmentStore(root)
    first = store.prepare(normalise(["python-dateutil"]), policy, target)
    before = _disk(root)
    second = store.prepare(SMALL, policy, target)
    after = _disk(root)
    other = target.model_copy(update={"version": "3.11.2" if target.version != "3.11.2" else "3.11.9"})
    twin = store.prepare(SMALL, policy, other)
    after_twin = _disk(root)
    return {
        "first_env_installed_bytes": first.record.size_bytes,
        "second_env_installed_bytes": second.record.size_bytes,
        "second_env_adds_bytes": after - before,
        "twin_env_installed_bytes": twin.record.size_bytes,
        "twin_env_adds_bytes": after_twin - after,
        "twin_env_unshared_bytes": twin.record.unshared_bytes,
    }


def _docker(tag: str, runtime: str, argv: list[str], site: Path | None = None) -> str:
    cmd = ["docker", "run", "--rm", "--network=none", "--read-only", "--user=65534:65534", f"--runtime={runtime}"]
    if site is not None:
        cmd.append(f"--volume={site}:{MOUNT_PATH}:ro")
    done = subprocess.run([*cmd, tag, *argv], capture_output=True, text=True, check=True, timeout=300)
    return done.stdout


def numpy_imports(work: Path, tag: str | None, runtimes: list[str], rounds: int) -> dict[str, Any]:
    policy = DependencyPolicy(allow=("numpy",), source="index")
    out: dict[str, Any] = {}
    host_site = EnvironmentStore(work / "numpy").prepare(normalise(["numpy"]), policy, probe()).site
    prelude = f"import sys; sys.path.insert(0, {str(host_site)!r}); "
    host = [float(subprocess.run([sys.executable, "-I", "-S", "-B", "-c", prelude + IMPORT_NUMPY], check=True,
                                 capture_output=True, text=True).stdout) for _ in range(rounds)]  # fmt: skip
    out["host_ms"] = _p50(host)
    for runtime in runtimes if tag else []:
        assert tag is not None
        target = parse_probe(_docker(tag, runtime, ["python3", *PROBE_ARGV]))
        site = EnvironmentStore(work / "numpy").prepare(normalise(["numpy"]), policy, target).site
        inside = f"import sys; sys.path.insert(0, {MOUNT_PATH!r}); " + IMPORT_NUMPY
        samples = [float(_docker(tag, runtime, ["python3", "-I", "-S", "-B", "-c", inside], site))
                   for _ in range(rounds)]  # fmt: skip
        out[f"{runtime}_ms"] = _p50(samples)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheelhouse", type=Path, default=Path(".wheelhouse"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-numpy", action="store_true")
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--runtimes", default="runc,runsc")
    args = parser.parse_args()
    policy = DependencyPolicy(allow=ALLOW, source="offline", wheelhouse=str(args.wheelhouse.resolve()))
    target = probe()
    report: dict[str, Any] = {"target": target.label(), "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as tmp:
        work = Path(tmp)
        report["builds"] = builds(work, policy, target, args.rounds)
        report["cache_hit"] = cache_hits(work, policy, target)
        report["disk"] = disk(work, policy, target)
        if not args.no_numpy:
            tag = None
            if not args.no_docker:
                from sandforge.sandbox import image

                tag = image.expected_tag()
            report["numpy_import"] = numpy_imports(work, tag, args.runtimes.split(","), args.rounds)
        shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
