"""`sandforge exec --cluster ADDRESS` end to end (issue 22): the real command line, in its own process, against a
real local cluster, over a direct GCS connection and over Ray Client. The program runs on a node (its outcome
names one of the nodes `sandforge cluster status` lists), its context is committed by the command on the caller's
side, a fetch it makes is decided by the caller's policy, and an unreachable cluster is exit 6 in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandforge.sandbox.cluster.local import LocalCluster
from tests.cluster.conftest import SHARED_CLUSTER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), SHARED_CLUSTER]

ACME = Path(__file__).resolve().parents[2] / "policies" / "examples" / "acme"
PROGRAM = """
context['runs'] = context.get('runs', 0) + 1
return {'runs': context['runs']}
"""


def sandforge(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "sandforge"), *args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def cli_env(cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SANDFORGE_"))}
    env.update(cluster.env())  # the cluster's token, and nothing else of the test process's settings
    env["SANDFORGE_STATE_DIR"] = str(cluster.root.parent)
    return env


def node_ids(cluster: LocalCluster, tmp_path: Path) -> set[str]:
    """The cluster's nodes, as `sandforge cluster status --json` lists them (another process, another driver)."""
    done = sandforge(["cluster", "status", "--json"], cli_env(cluster, tmp_path), tmp_path)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    return {row["node_id"] for row in json.loads(done.stdout)["nodes"]}


@pytest.mark.parametrize("via", ["gcs", "client"])
def test_exec_cluster_runs_the_program_on_a_node_and_commits_its_context(
    cluster: LocalCluster, tmp_path: Path, via: str
) -> None:
    state = cluster.state()
    assert state is not None
    address = state.gcs_address if via == "gcs" else state.client_address
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    context = tmp_path / "ctx.json"
    context.write_text(json.dumps({"runs": 1}))
    env = cli_env(cluster, tmp_path)
    args = ["exec", "--cluster", address, str(program), "--context", str(context), "--commit", "--json"]
    done = sandforge(args, env, tmp_path)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    result = json.loads(done.stdout)
    assert result["status"] == "ok"
    assert result["value"] == {"runs": 2}
    assert result["metadata"]["cluster_node"] in node_ids(cluster, tmp_path)  # it ran on a node of the cluster
    assert json.loads(context.read_text()) == {"runs": 2}  # committed by the command, on the caller's side
    # and once more through SANDFORGE_CLUSTER instead of the flag
    env["SANDFORGE_CLUSTER"] = address
    again = sandforge(["exec", str(program), "--context", str(context), "--commit", "--json"], env, tmp_path)
    assert again.returncode == 0, (again.stdout, again.stderr[-3000:])
    assert json.loads(again.stdout)["metadata"]["cluster_node"] in node_ids(cluster, tmp_path)
    assert json.loads(context.read_text()) == {"runs": 3}


def test_exec_cluster_failure_commits_nothing_and_fetches_are_the_callers_to_decide(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    state = cluster.state()
    assert state is not None
    program = tmp_path / "prog.py"
    program.write_text(
        "try:\n    fetch('https://' + args[0] + '/')\n    got = 'fetched'\n"
        "except Exception as exc:\n    got = str(exc)\n"
        "context['got'] = got\nraise ValueError(got)\n"
    )
    context = tmp_path / "ctx.json"
    context.write_text(json.dumps({"kept": True}))
    done = sandforge(
        ["exec", "--cluster", state.address, str(program), "--context", str(context), "--commit", "--json",
         "--policy", str(ACME), "--args", '["evil.example"]'],  # ACME grants fetches of news.google.com only
        cli_env(cluster, tmp_path), tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    result = json.loads(done.stdout)
    assert result["error_type"] == "execution"
    assert "fetched" not in result["error_message"], result["error_message"]
    assert "evil.example" in result["error_message"] and "denied" in result["error_message"], result["error_message"]
    assert result["metadata"]["cluster_node"] in node_ids(cluster, tmp_path)
    assert json.loads(context.read_text()) == {"kept": True}  # a failed execution commits nothing


def test_exec_against_an_unreachable_cluster_is_exit_6_in_one_line(cluster: LocalCluster, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    program = tmp_path / "prog.py"
    program.write_text("return 1\n")
    env = {**cli_env(cluster, tmp_path), "SANDFORGE_CLUSTER_CONNECT_TIMEOUT_S": "2"}
    done = sandforge(["exec", "--cluster", f"ray://127.0.0.1:{port}", str(program)], env, tmp_path)
    assert done.returncode == 6, (done.stdout, done.stderr[-3000:])
    out = (done.stdout + done.stderr).strip()
    assert "cannot connect to the Ray cluster" in out, out
