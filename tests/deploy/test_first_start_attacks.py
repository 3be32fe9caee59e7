"""Red team on the first start (``serve --init-from``): what an attacker who can write in the state volume before
the service first starts can plant there (``runtime/deploy/first_start.py``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandforge.runtime.deploy.first_start import TOKENS_DIR, init_from_template
from sandforge.runtime.errors import ConfigError, FileIOError
from sandforge.runtime.files.dirs import SymlinkRefused
from tests.deploy.test_first_start import TWO, template


def test_a_tokens_dir_planted_as_a_symlink_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config.parent.mkdir()
    (config.parent / TOKENS_DIR).symlink_to(elsewhere)
    with pytest.raises(SymlinkRefused, match="symlink"):
        init_from_template(template(tmp_path, TWO), config)
    assert list(elsewhere.iterdir()) == [] and not config.exists()  # no token out there, no config: redone later


def test_a_token_file_planted_as_a_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (config.parent / TOKENS_DIR).mkdir(parents=True, mode=0o700)
    (config.parent / TOKENS_DIR / "acme.token").symlink_to(victim)
    assert init_from_template(template(tmp_path, TWO), config) == ["acme"]
    token_file = config.parent / TOKENS_DIR / "acme.token"
    assert victim.read_text() == "untouched" and not token_file.is_symlink()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


def test_a_loose_tokens_dir_there_before_the_first_start_is_made_private(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    tokens = config.parent / TOKENS_DIR
    tokens.mkdir(parents=True)
    tokens.chmod(0o777)
    assert init_from_template(template(tmp_path, TWO), config) == ["acme"]
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o700


def test_a_dangling_config_symlink_is_refused_not_written_through(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    config.parent.mkdir()
    target = tmp_path / "anywhere.yaml"
    config.symlink_to(target)
    with pytest.raises(SymlinkRefused, match="symlink to nothing"):
        init_from_template(template(tmp_path, TWO), config)
    assert not target.exists() and not (config.parent / TOKENS_DIR).exists()


def test_a_config_symlink_to_an_existing_config_is_an_operator_setup_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("tenants: []\n")
    config = tmp_path / "volume" / "server.yaml"
    config.parent.mkdir()
    config.symlink_to(real)
    assert init_from_template(template(tmp_path, TWO), config) == [] and real.read_text() == "tenants: []\n"


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "acme\x00", "x" * 80])
def test_a_tenant_name_cannot_place_its_token_file_outside_the_tokens_dir(tmp_path: Path, name: str) -> None:
    config = tmp_path / "volume" / "server.yaml"
    with pytest.raises(ConfigError, match="name"):
        init_from_template(template(tmp_path, f"tenants:\n  - name: {name!r}\n"), config)
    assert not config.parent.exists() or os.listdir(config.parent) in ([], [".server.yaml.lock"])


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    config.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (config.parent / ".server.yaml.lock").symlink_to(victim)  # filelock opens its file O_NOFOLLOW
    with pytest.raises(FileIOError, match="ELOOP"):
        init_from_template(template(tmp_path, TWO), config)
    assert victim.read_text() == "precious" and not config.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_a_tokens_dir_of_another_user_is_refused_before_any_token_is_written(tmp_path: Path) -> None:
    config = tmp_path / "volume" / "server.yaml"
    tokens = config.parent / TOKENS_DIR
    tokens.mkdir(parents=True, mode=0o700)
    os.chown(tokens, 12345, 12345)
    with pytest.raises(FileIOError, match="belongs to user 12345"):
        init_from_template(template(tmp_path, TWO), config)
    assert list(tokens.iterdir()) == [] and not config.exists()
