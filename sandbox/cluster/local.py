"""A local Ray cluster of several nodes on this machine (``sandforge cluster up/down/status``, the tests).

Real ``ray start`` processes: a head and ``nodes - 1`` workers, every server bound to 127.0.0.1, token
authentication on (``RAY_AUTH_MODE=token``, a fresh token in a 0600 file), each node declaring the backends
it offers as ``sandforge_backend_<name>`` resources. Its state (ports, token path, Ray's temp directory) is a
JSON file in the cluster's directory; ``down`` ends exactly the processes of that cluster (found by its temp
directory, and their descendants), never another Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, Field

from sandforge.sandbox.cluster.executor import RESOURCE_PREFIX

STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"  # noqa: S105 - a file name, not a secret
START_TIMEOUT_S = 240.0
#: Ray's system config for a sandbox-host cluster (the head hands it to every node and driver). Node failure
#: detection stays fast (the fault tests); what a fixed cluster of sandbox hosts does not use is off, as it
#: competes with the sandboxes for the same cores (issue 22, round 7: bench/bench_cluster_cpu.py):
#: metrics collection and export (every process, every few seconds), the timeline's profile events, the event
#: loops' per-handler statistics (CPU on every RPC of every process), Ray's memory monitor (sandboxes have
#: their own memory limits), and the autoscaler's resource-load pulls (no autoscaler runs: ``--no-monitor``).
SYSTEM_CONFIG: dict[str, object] = {
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
    "enable_metrics_collection": False,
    "enable_timeline": False,
    "event_stats": False,
    "memory_monitor_refresh_ms": 0,
    "gcs_pull_resource_loads_period_milliseconds": 5000,
}


#: How long the cluster's processes have to end on SIGTERM before SIGKILL. The sandbox hosts end their sandboxes and
#: exit well within it; Ray's own daemons (gcs_server, the raylets, their runtime-env agents) wait ~10 s on each
#: other after SIGTERM, and nothing of theirs outlives the cluster (its temp directory is removed next).
STOP_GRACE_S = 2.0


class ClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped (one line)."""


class NodeSpec(BaseModel):
    backends: tuple[str, ...] = ("subprocess",)
    num_cpus: int = Field(1, ge=0, le=64)


class ClusterState(BaseModel):
    gcs_port: int
    client_port: int
    temp_dir: str
    token_file: str
    nodes: list[NodeSpec] = Field(default_factory=list)
    started_at: float = 0.0

    @property
    def address(self) -> str:
        """What ``SANDFORGE_CLUSTER`` takes for a caller on this machine: the GCS address (the caller becomes a
        Ray driver on the node here, one hop to a sandbox host; Ray Client's two hops cost ~4 ms more)."""
        return self.gcs_address

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        """The Ray Client address (``ray://``): for callers on machines that are not nodes of the cluster."""
        return f"ray://127.0.0.1:{self.client_port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_env(token_file: str | Path) -> dict[str, str]:
    """The environment every process of the cluster and its callers run with: token authentication on, the
    token from its file, loopback addresses kept (Ray's 'no multi-node' switch, which makes every Ray
    process of the cluster use 127.0.0.1; ``raystart`` lets ``ray start`` add nodes all the same)."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


class LocalCluster:
    """A cluster whose state lives in ``root`` (one per directory)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # --- state ----------------------------------------------------------------------------------------

    def state(self) -> ClusterState | None:
        path = self.root / STATE_FILE
        if not path.is_file():
            return None
        try:
            return ClusterState.model_validate_json(path.read_text())
        except ValueError as exc:
            raise ClusterError(f"unreadable cluster state {path}: {str(exc).splitlines()[0]}") from None

    def _save(self, state: ClusterState) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(state.model_dump_json(indent=2))
        tmp.replace(self.root / STATE_FILE)

    def env(self) -> dict[str, str]:
        state = self._require()
        return ray_env(state.token_file)

    def _require(self) -> ClusterState:
        state = self.state()
        if state is None:
            raise ClusterError(f"no local cluster in {self.root}: start one with 'sandforge cluster up'")
        return state

    # --- up / down --------------------------------------------------------------------------------------

    def up(
        self, nodes: int = 3, backends: tuple[str, ...] = ("subprocess",), specs: list[NodeSpec] | None = None
    ) -> ClusterState:
        """Start a head and ``nodes - 1`` workers (or one node per spec); ClusterError if one is running."""
        if self.state() is not None and self.processes():
            raise ClusterError(f"a local cluster is already running in {self.root}; 'sandforge cluster down' first")
        specs = specs or [NodeSpec(backends=backends) for _ in range(nodes)]
        if not specs:
            raise ClusterError("a cluster needs at least one node")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        token_file = self.root / TOKEN_FILE
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        temp_dir = tempfile.mkdtemp(prefix="sfray-")  # short: Ray's socket paths must fit 107 bytes
        state = ClusterState(
            gcs_port=_free_port(), client_port=_free_port(), temp_dir=temp_dir, token_file=str(token_file),
            nodes=[], started_at=time.time(),
        )  # fmt: skip
        self._save(state)
        try:
            self._start_head(state, specs[0])
            state.nodes.append(specs[0])
            self._save(state)
            for spec in specs[1:]:
                self.add_node(spec)
        except BaseException:
            self.down()
            raise
        return self._require()

    def _ray(self, state: ClusterState, args: list[str]) -> None:
        env = {**os.environ, **ray_env(state.token_file)}
        cmd = [sys.executable, "-m", "sandforge.sandbox.cluster.raystart", "start", *args]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"ray start did not finish within {START_TIMEOUT_S:g}s") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise ClusterError(f"ray start failed: {tail[0][:300]}")

    @staticmethod
    def _node_args(spec: NodeSpec) -> list[str]:
        resources = {f"{RESOURCE_PREFIX}{name}": 1000 for name in spec.backends}
        return [
            "--node-ip-address=127.0.0.1", f"--num-cpus={spec.num_cpus}", f"--resources={json.dumps(resources)}",
            "--dashboard-agent-listen-port=0", "--min-worker-port=0", "--max-worker-port=0",
            "--disable-usage-stats", "--include-log-monitor=false",
        ]  # fmt: skip

    def _start_head(self, state: ClusterState, spec: NodeSpec) -> None:
        self._ray(state, [
            "--head", f"--port={state.gcs_port}", f"--ray-client-server-port={state.client_port}",
            "--include-dashboard=false", "--no-monitor", f"--temp-dir={state.temp_dir}",
            f"--system-config={json.dumps(SYSTEM_CONFIG)}",
            *self._node_args(spec),
        ])  # fmt: skip

    def add_node(self, spec: NodeSpec) -> None:
        """Start one more worker node."""
        state = self._require()
        self._ray(state, [f"--address={state.gcs_address}", *self._node_args(spec)])
        state.nodes.append(spec)
        self._save(state)

    def restart_head(self) -> None:
        """Kill the head's processes (the whole cluster goes with it) and start a fresh head on the same
        address and token, with the nodes given again: what an operator does after losing the head."""
        state = self._require()
        specs = list(state.nodes) or [NodeSpec()]
        self._kill(self.processes())
        state.nodes = []
        self._save(state)
        self._start_head(state, specs[0])
        state.nodes.append(specs[0])
        self._save(state)
        for spec in specs[1:]:
            self.add_node(spec)

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those started with its temp directory, and their descendants."""
        state = self.state()
        if state is None:
            return []
        found: dict[int, psutil.Process] = {}
        marks = (state.temp_dir, f"127.0.0.1:{state.gcs_port}")  # the client server names only the address
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(mark in part for part in proc.info["cmdline"] or () for mark in marks) or _ours(
                    proc, state.token_file
                ):
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except psutil.Error:
                continue
        return list(found.values())

    def raylets(self) -> list[psutil.Process]:
        """The nodes' raylet processes (killing one kills its node: the fault tests)."""
        return [p for p in self.processes() if _name(p) == "raylet"]

    @staticmethod
    def _kill(procs: list[psutil.Process], timeout_s: float = STOP_GRACE_S) -> None:
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=timeout_s)

    def down(self) -> int:
        """Stop every process of the cluster and remove its temp directory; returns how many were ended."""
        state = self.state()
        procs = self.processes()
        self._kill(procs)
        if state is not None:
            shutil.rmtree(state.temp_dir, ignore_errors=True)
            (self.root / STATE_FILE).unlink(missing_ok=True)
        return len(procs)

    def describe(self) -> dict[str, Any]:
        state = self._require()
        return {
            "address": state.address, "gcs_address": state.gcs_address, "client_address": state.client_address,
            "token_file": state.token_file,
            "nodes": [n.model_dump() for n in state.nodes], "processes": len(self.processes()),
        }  # fmt: skip


def _ours(proc: psutil.Process, token_file: str) -> bool:
    """A Ray process renamed ``ray::...`` (agents, workers) shows no address: it inherited our token path."""
    try:
        name = proc.name()
        if not (name.startswith("ray::") or name in ("raylet", "gcs_server")):
            return False
        return proc.environ().get("RAY_AUTH_TOKEN_PATH") == token_file
    except psutil.Error:
        return False


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return ""
