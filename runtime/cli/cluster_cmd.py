"""`sandforge cluster up/down/status`: a local Ray test cluster of real `ray start` nodes (docs/deploy.md)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.cli.common import SandforgeGroup
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import SandforgeError, UsageError
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.sandbox import BACKENDS, Sandbox, SandboxConfig
from sandforge.sandbox.cluster.local import ClusterError, LocalCluster


class ClusterCommandError(SandforgeError):
    """The local cluster could not be started, reached or stopped."""


def cluster_root(state_dir: Path | None = None) -> Path:
    """Where the local cluster's state and token live: ``<state dir>/cluster``."""
    return resolve_state_dir(state_dir) / "cluster"


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise UsageError(
            f"--backends: unknown backend {', '.join(unknown) or '(none)'}; choose from {', '.join(BACKENDS)}"
        )
    return names


@click.group(cls=SandforgeGroup)
def command() -> None:
    """A local Ray cluster on 127.0.0.1 with token authentication (for tests and trying the Ray executor)."""


command.name = "cluster"


@command.command("up")
@click.option("--nodes", type=click.IntRange(1, 16), default=3, show_default=True, help="Nodes (head included).")
@click.option("--backends", default="subprocess", show_default=True, help="Backends every node offers (comma list).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def up(nodes: int, backends: str, as_json: bool) -> None:
    """Start the cluster (real `ray start` processes) and print how to use it."""
    cluster = LocalCluster(cluster_root())
    try:
        state = cluster.up(nodes=nodes, backends=_backends(backends))
    except ClusterError as exc:
        raise ClusterCommandError(str(exc)) from None
    info = cluster.describe()
    if as_json:
        emit_json(info)
        return
    click.echo(f"cluster up: {len(state.nodes)} nodes at {state.address} (token in {state.token_file})")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in cluster.env().items())
    click.echo(f"use it:   export {exports} SANDFORGE_CLUSTER={state.address}")
    click.echo(f"          (from a machine that is not a node: SANDFORGE_CLUSTER={state.client_address}, Ray Client)")
    click.echo("stop it:  sandforge cluster down")


@command.command("down")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def down(as_json: bool) -> None:
    """Stop every process of the local cluster."""
    cluster = LocalCluster(cluster_root())
    ended = 0 if cluster.state() is None else cluster.down()
    if as_json:
        emit_json({"stopped": ended})
    else:
        click.echo(f"cluster down: {ended} processes stopped" if ended else "no local cluster is running")


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(as_json: bool) -> None:
    """Each node: its backends, its sandbox host's warm pools, executions in flight and the machine's load."""
    cluster = LocalCluster(cluster_root())
    try:
        state = cluster.state()
        if state is None:
            raise ClusterCommandError("no local cluster is running; start one with 'sandforge cluster up'")
        import os

        os.environ.update(cluster.env())
        with Sandbox(SandboxConfig.from_env(cluster=state.address)) as sandbox:
            rows = sandbox._cluster().status()
    except ClusterError as exc:
        raise ClusterCommandError(str(exc)) from None
    if as_json:
        emit_json({"address": state.address, "nodes": rows})
        return
    click.echo(f"cluster {state.address}: {len(rows)} nodes")
    for row in rows:
        click.echo(_row(row))


def _row(row: dict[str, Any]) -> str:
    head = f"  {row['node_id'][:12]}  backends={','.join(row['backends'])}"
    if "error" in row:
        return f"{head}  unreachable: {row['error']}"
    pools = ", ".join(f"{p['backend']}{'/' + p['env_id'][:8] if p['env_id'] else ''} {p['ready']}/{p['size']}"
                      for p in row.get("pools", [])) or "none"  # fmt: skip
    load = "/".join(f"{x:.2f}" for x in row.get("load", []))
    return f"{head}  warm: {pools}  in flight: {row['in_flight']}  executed: {row['executed']}  load: {load}"
