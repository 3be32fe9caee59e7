"""`sandforge tokens create|revoke --json`: one JSON object each (issue 21: every data command has --json)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sandforge.runtime.service.tenants import hash_token, load_server_config
from tests.service.serverproc import SANDFORGE


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDFORGE, "tokens", *args], capture_output=True, text=True, check=False)


def test_create_and_revoke_print_json(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    made = _run("create", "alpha", "--new-tenant", "--config", str(config), "--json")
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["tenant"] == "alpha" and created["token_hash"] == hash_token(created["token"])
    assert load_server_config(config).tenant("alpha").token_hashes == (created["token_hash"],)
    gone = _run("revoke", created["token"], "--config", str(config), "--json")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout) == {"tenant": "alpha", "revoked": created["token_hash"]}
    assert load_server_config(config).tenant("alpha").token_hashes == ()
