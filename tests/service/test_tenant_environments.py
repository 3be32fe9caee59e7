"""Each tenant's third-party environments live in its own state directory: tenant B never runs, finds or
reuses an environment tenant A's program built, even for the very same manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sandforge.runtime.service.tenants import TenantRuntimes, load_server_config
from tests.environments.helpers import WHEELHOUSE_ALLOW, require_wheelhouse

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _env_dirs(state: Path) -> set[str]:
    envs = state / "environments" / "envs"
    return {p.name for p in envs.iterdir()} if envs.is_dir() else set()


def test_a_tenants_environment_is_never_reused_by_another(tmp_path: Path) -> None:
    house = require_wheelhouse()
    layer = tmp_path / "deps"
    layer.mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "source": "offline", "wheelhouse": str(house)}
    (layer / "deps.yaml").write_text(yaml.safe_dump({"dependencies": section}))
    (tmp_path / "programs.json").write_text(json.dumps([DATEUTIL]))
    tenant = {"policy": ["deps"], "provider": {"kind": "scripted", "programs": "programs.json"}}
    (tmp_path / "server.yaml").write_text(
        yaml.safe_dump({"state_dir": "state", "tenants": [{"name": "alpha", **tenant}, {"name": "beta", **tenant}]})
    )
    runtimes = TenantRuntimes(load_server_config(tmp_path / "server.yaml"))
    try:
        alpha, beta = runtimes.get("alpha"), runtimes.get("beta")
        assert alpha.environments_dir == alpha.state_dir / "environments"
        assert beta.environments_dir == beta.state_dir / "environments"

        first = alpha.workspace.call("dates", "iso", "5 March 2024")
        assert first.ok and first.value == "2024-03-05T00:00:00", first
        built = _records(alpha.call_log_path)[-1]
        assert built["environment_cache_hit"] is False
        assert _env_dirs(alpha.state_dir) == {built["env_id"]}
        assert _env_dirs(beta.state_dir) == set()

        again = alpha.workspace.call("dates", "iso", "6 March 2024")
        assert again.ok and _records(alpha.call_log_path)[-1]["environment_cache_hit"] is True

        other = beta.workspace.call("dates", "iso", "7 March 2024")
        assert other.ok and other.value == "2024-03-07T00:00:00", other
        theirs = _records(beta.call_log_path)[-1]
        # the same manifest, policy and interpreter give the same identity, but beta builds its own copy
        assert theirs["env_id"] == built["env_id"]
        assert theirs["environment_cache_hit"] is False
        assert _env_dirs(beta.state_dir) == {built["env_id"]}
        assert not (runtimes.config.state_dir / "environments").exists()  # nothing in a shared directory
    finally:
        runtimes.close()


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
def test_the_environments_directory_is_inside_the_tenants_state(tmp_path: Path, tenant: str) -> None:
    (tmp_path / "server.yaml").write_text("tenants: [{name: alpha}, {name: beta, state_dir: /tmp/elsewhere-b}]\n")
    runtimes = TenantRuntimes(load_server_config(tmp_path / "server.yaml"))
    rt = runtimes.get(tenant)
    assert rt.environments_dir.parent == rt.state_dir
    assert rt.environments.store.root == rt.environments_dir
    runtimes.close()
