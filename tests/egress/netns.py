"""Egress tests run in a network namespace of their own with only ``lo`` up, so that even a broken broker
cannot send a packet off the machine.

A test module opts in with ``pytestmark = pytest.mark.netns``. Outside such a namespace, each marked test
is not run in-process: the first of a module runs the whole module once in ``unshare --net`` (as root; else
``unshare --map-root-user --net``), under the same root directory, and every marked test then reports the
outcome its own node id had there (shared between xdist workers through a locked cache file). Where no
namespace can be made the marked tests skip, saying why. Inside, ``lo`` is brought up and the namespace is
verified to hold nothing else before any test runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests import durations

ENV_INSIDE = "SANDFORGE_EGRESS_NETNS"
ENV_REPORT = "SANDFORGE_EGRESS_NETNS_REPORT"
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
CHILD_TIMEOUT_S = 900


def inside() -> bool:
    return os.environ.get(ENV_INSIDE) == "1"


def bring_lo_up() -> None:
    """``ip link set lo up`` without iproute2, then check nothing but ``lo`` exists."""
    with socket.socket() as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        raise RuntimeError(f"{ENV_INSIDE}=1 but this network namespace has interfaces {names}")


@cache
def unshare_command() -> tuple[list[str] | None, str]:
    """The command prefix that makes a fresh network namespace here, or None and why not."""
    binary = shutil.which("unshare")
    if binary is None:
        return None, "unshare(1) is not installed"
    candidates = [[binary, "--net"]] if os.geteuid() == 0 else []
    candidates.append([binary, "--map-root-user", "--net"])
    problems: list[str] = []
    for prefix in candidates:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30, check=False)
        if probe.returncode == 0:
            return prefix, ""
        problems.append(f"{' '.join(prefix[1:])}: {probe.stderr.strip() or probe.returncode}")
    return None, "cannot create a network namespace (" + "; ".join(problems) + ")"


STALE_AFTER_S = 6 * 3600


def _shared_dir() -> Path:
    """This run's cache directory (shared by its xdist workers); earlier runs' directories are swept."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    base = Path(tempfile.gettempdir())
    prefix = f"sandforge-egress-netns-{os.getuid()}-"
    path = base / f"{prefix}{run}"
    if not path.exists():
        now = time.time()
        for old in base.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                if old.is_dir() and not old.is_symlink() and now - old.stat().st_mtime > STALE_AFTER_S:
                    shutil.rmtree(old)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _run_module(rootdir: Path, module: str) -> dict[str, Any]:
    """Run `module` in a fresh network namespace once per test run; its per-test outcomes by node id."""
    prefix, why = unshare_command()
    assert prefix is not None, why
    shared = _shared_dir()
    key = module.replace("/", "_").replace(".", "_")
    result_file = shared / f"{key}.json"
    with FileLock(str(shared / f"{key}.lock")):
        if result_file.exists():
            data: dict[str, Any] = json.loads(result_file.read_text())
            return data
        report = shared / f"{key}.jsonl"
        report.unlink(missing_ok=True)
        env = {**os.environ, ENV_INSIDE: "1", ENV_REPORT: str(report)}
        env.pop("PYTEST_XDIST_WORKER", None)
        command = [
            *prefix,
            "--",
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:randomly",
            f"--rootdir={rootdir}",
            module,
        ]
        try:
            done = subprocess.run(
                command, cwd=rootdir, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
            )
            output, code = (done.stdout + done.stderr)[-6000:], done.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = f"timed out after {CHILD_TIMEOUT_S} s: {exc}", -1
        outcomes: dict[str, dict[str, str]] = {}
        if report.exists():
            for line in report.read_text().splitlines():
                entry = json.loads(line)
                current = outcomes.setdefault(entry["nodeid"], {"outcome": "passed", "detail": ""})
                if entry["outcome"] == "failed" or (entry["outcome"] == "skipped" and current["outcome"] == "passed"):
                    current.update(outcome=entry["outcome"], detail=entry["detail"])
        data = {"outcomes": outcomes, "output": output, "code": code}
        result_file.write_text(json.dumps(data))
        return data


def mirror(item: pytest.Item) -> None:
    """Report for `item` what its node id did inside the namespace."""
    module = item.nodeid.split("::", 1)[0]
    data = _run_module(Path(str(item.config.rootpath)), module)
    found = data["outcomes"].get(durations.without_group(item.nodeid))  # the namespace's run has no groups
    if found is None:
        pytest.fail(
            f"{item.nodeid} did not run in the network namespace (exit {data['code']}):\n{data['output']}",
            pytrace=False,
        )
    if found["outcome"] == "failed":
        pytest.fail(f"failed inside the network namespace:\n{found['detail']}", pytrace=False)
    if found["outcome"] == "skipped":
        pytest.skip(f"skipped inside the network namespace: {found['detail']}")


def configure_items(items: list[pytest.Item]) -> None:
    """Outside a namespace, marked tests mirror the namespace's run (or skip when none can be made)."""
    if inside():
        return
    for item in items:
        if item.get_closest_marker("netns") is None:
            continue
        prefix, why = unshare_command()
        if prefix is None:
            item.add_marker(pytest.mark.skip(reason=f"egress tests need a network namespace: {why}"))
            continue
        item.add_marker(pytest.mark.timeout(CHILD_TIMEOUT_S + 60))
        item.setup = lambda: None  # type: ignore[method-assign]  # no fixtures out here: nothing starts
        item.runtest = lambda item=item: mirror(item)  # type: ignore[method-assign]


def log_report(report: pytest.TestReport) -> None:
    path = os.environ.get(ENV_REPORT)
    if not path or not inside():
        return
    detail = ""
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2])
    elif report.outcome != "passed":
        detail = str(report.longrepr)[-4000:]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "detail": detail}) + "\n")
