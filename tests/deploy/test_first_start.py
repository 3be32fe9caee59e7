"""A container's first start (``serve --init-from``): tokens made into the state volume, never printed, once."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from sandforge.runtime.deploy.first_start import TOKENS_DIR, init_from_template
from sandforge.runtime.errors import ConfigError
from sandforge.runtime.service.tenants import hash_token, load_server_config


def template(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "etc" / "server.yaml"
    path.parent.mkdir()
    (path.parent / "programs.json").write_text('["return 1"]')
    path.write_text(text)
    return path


TWO = """state_dir: state
tenants:
  - name: acme
    provider: {kind: scripted, programs: programs.json}
  - name: globex
    token_hashes: ['sha256:%s']
""" % ("a" * 64)


def test_the_first_start_makes_one_private_token_per_tenant_without_one(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    assert init_from_template(template(tmp_path, TWO), config) == ["acme"]
    token_file = config.parent / TOKENS_DIR / "acme.token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert not (config.parent / TOKENS_DIR / "globex.token").exists()
    loaded = load_server_config(config)
    assert loaded.authenticate(token).name == "acme"  # type: ignore[union-attr]
    assert token not in config.read_text() and hash_token(token) in config.read_text()
    # the template's relative paths now point at the template's directory, from the volume
    acme = yaml.safe_load(config.read_text())["tenants"][0]
    assert Path(acme["provider"]["programs"]) == tmp_path / "etc" / "programs.json"


def test_a_later_start_changes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    source = template(tmp_path, TWO)
    init_from_template(source, config)
    before = (config.read_bytes(), (config.parent / TOKENS_DIR / "acme.token").read_bytes())
    assert init_from_template(source, config) == []
    assert (config.read_bytes(), (config.parent / TOKENS_DIR / "acme.token").read_bytes()) == before


def test_a_bad_template_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    with pytest.raises(ConfigError):
        init_from_template(template(tmp_path, "tenants: [{name: 'Bad Name'}]\n"), config)
    assert not config.exists() and not (config.parent / TOKENS_DIR).exists()
