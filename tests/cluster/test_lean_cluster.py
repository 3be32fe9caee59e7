"""The local test cluster runs only what a sandbox-host cluster uses (issue 22, round 7): no log monitors, no
autoscaler monitor, and Ray's system config without metrics, timeline, event-loop statistics or memory
monitor (they competed with the sandboxes for the same cores), on every node; executions still run on every
node, with token authentication on."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import psutil
import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.cluster.local import SYSTEM_CONFIG, LocalCluster
from tests.cluster.conftest import SHARED_CLUSTER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), SHARED_CLUSTER]


def _cmdlines(cluster: LocalCluster) -> list[list[str]]:
    lines = []
    for proc in cluster.processes():
        try:
            lines.append(proc.cmdline())
        except psutil.Error:
            continue
    return lines


def test_no_log_monitor_and_no_autoscaler_run(cluster: LocalCluster) -> None:
    lines = [" ".join(line) for line in _cmdlines(cluster)]
    assert sum("raylet/raylet" in line for line in lines) == 2  # both nodes are up
    assert not [line for line in lines if "log_monitor.py" in line]
    assert not [line for line in lines if "autoscaler/_private/monitor.py" in line]


def test_the_head_carries_the_lean_system_config(cluster: LocalCluster) -> None:
    """The GCS hands its system config to every raylet (and they to their workers): it is the head's."""
    configs = [
        json.loads(base64.b64decode(arg.split("=", 1)[1]))
        for line in _cmdlines(cluster)
        if line and line[0].endswith("gcs_server")
        for arg in line
        if arg.startswith("--config_list=")
    ]
    assert len(configs) == 1
    config = configs[0]
    for key, value in SYSTEM_CONFIG.items():
        assert config.get(key) == value, key
    assert config["enable_metrics_collection"] is False and config["event_stats"] is False
    assert config["health_check_period_ms"] <= 1000  # a lost node is still found within seconds


def test_executions_run_on_every_node_of_the_lean_cluster(cluster: LocalCluster) -> None:
    state = cluster.state()
    assert state is not None
    with Sandbox(SandboxConfig(cluster=state.address, pool_size=1)) as sb:
        seen = set()
        for _ in range(12):
            outcome = sb.execute(ExecutionRequest(code="return 41 + 1"))
            assert outcome.ok and outcome.value == 42, outcome.error_message
            seen.add(outcome.metadata["cluster_node"])
        assert len(seen) == 2


def test_the_cluster_state_keeps_its_token_private(cluster: LocalCluster) -> None:
    state = cluster.state()
    assert state is not None
    assert Path(state.token_file).stat().st_mode & 0o077 == 0
    assert cluster.env()["RAY_AUTH_MODE"] == "token"
