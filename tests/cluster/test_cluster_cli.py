"""`sandforge cluster` without a running cluster, and its usage errors (no Ray processes are started here;
the commands' cluster work is LocalCluster's, exercised on real clusters by the other tests of this folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.sandbox import SandboxConfig
from sandforge.sandbox.config import SandboxConfigError


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path))
    return tmp_path


def test_status_without_a_cluster_is_a_one_line_error() -> None:
    result = CliRunner().invoke(main, ["cluster", "status"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: no local cluster is running; start one with 'sandforge cluster up'"


def test_down_without_a_cluster_says_so() -> None:
    result = CliRunner().invoke(main, ["cluster", "down", "--json"])
    assert result.exit_code == 0
    assert result.output.strip() == '{"stopped":0}'


def test_up_refuses_an_unknown_backend_before_starting_anything(state_dir: Path) -> None:
    result = CliRunner().invoke(main, ["cluster", "up", "--backends", "subprocess,qemu"])
    assert result.exit_code == 2
    assert "unknown backend qemu" in result.output
    assert not (state_dir / "cluster").exists()


@pytest.mark.parametrize("address", ["ray://127.0.0.1:10001", "127.0.0.1:6379", "auto", "ray://head.example:10001"])
def test_cluster_addresses_are_accepted(address: str) -> None:
    assert SandboxConfig(cluster=address).cluster == address


@pytest.mark.parametrize("address", ["http://x:1", "ray://", "host", "ray://h:1/../x", "a b:1"])
def test_malformed_cluster_addresses_are_refused(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_CLUSTER", address)
    with pytest.raises(SandboxConfigError, match=r"(?i)cluster"):
        SandboxConfig.from_env()
