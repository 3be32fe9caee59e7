"""The tenant model: server.yaml, token hashes, authentication, and per-tenant runtimes that never share state."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandforge.runtime.errors import ConfigError
from sandforge.runtime.providers.base import GenerationRequest, ProviderError
from sandforge.runtime.service.tenants import (
    DailyCounter,
    MeteredProvider,
    TenantConfig,
    TenantRuntimes,
    hash_token,
    load_server_config,
    new_token,
    save_server_config,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_server_yaml_resolves_relative_paths_and_defaults(tmp_path: Path) -> None:
    cfg = load_server_config(
        _write(
            tmp_path / "server.yaml",
            "state_dir: st\ntenants:\n  - name: alpha\n  - name: beta\n    state_dir: /abs/beta\n"
            "    quotas: {concurrent_executions: 2, max_body_bytes: 4096}\n",
        )
    )
    assert cfg.state_dir == tmp_path / "st"
    assert cfg.tenant_state_dir(cfg.tenant("alpha")) == tmp_path / "st" / "tenants" / "alpha"
    assert cfg.tenant_state_dir(cfg.tenant("beta")) == Path("/abs/beta")
    assert cfg.tenant("beta").quotas.concurrent_executions == 2
    assert cfg.audit_path == tmp_path / "st" / "audit.jsonl"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("tenants: [{name: a}, {name: a}]", "unique"),
        ("tenants: [{name: 'A b'}]", "tenants.0.name"),
        ("tenants: [{name: a, token_hashes: [abc]}]", "sha256"),
        ("tenants: [{name: a, bogus: 1}]", "bogus"),
        ("tenants: [{name: a, state_dir: /x}, {name: b, state_dir: /x}]", "share a state directory"),
        ("tenants: [{name: a, provider: {kind: scripted}}]", "programs"),
    ],
)
def test_bad_configurations_are_one_line_config_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_server_config(_write(tmp_path / "server.yaml", text))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_authenticate_finds_the_tenant_of_a_token_and_nothing_else(tmp_path: Path) -> None:
    a, b = new_token(), new_token()
    assert a.startswith("sf_") and a != b
    cfg = load_server_config(_write(tmp_path / "server.yaml", "tenants: [{name: a}, {name: b}]"))
    cfg = cfg.with_tenant(cfg.tenant("a").model_copy(update={"token_hashes": (hash_token(a),)}))
    cfg = cfg.with_tenant(cfg.tenant("b").model_copy(update={"token_hashes": (hash_token(b),)}))
    auth_a, auth_b = cfg.authenticate(a), cfg.authenticate(b)
    assert auth_a is not None and auth_a.name == "a"
    assert auth_b is not None and auth_b.name == "b"
    for wrong in (None, "", a + "x", a[:-1], hash_token(a), hash_token("")):
        assert cfg.authenticate(wrong) is None


def test_a_hash_of_the_empty_token_never_authenticates(tmp_path: Path) -> None:
    cfg = load_server_config(_write(tmp_path / "server.yaml", "tenants: [{name: a}]"))
    cfg = cfg.with_tenant(TenantConfig(name="a", token_hashes=(hash_token(""),)))
    assert cfg.authenticate("") is None and cfg.authenticate(None) is None


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path / "server.yaml", "tenants: [{name: a}]")
    cfg = load_server_config(path)
    token = new_token()
    save_server_config(path, cfg.with_tenant(cfg.tenant("a").model_copy(update={"token_hashes": (hash_token(token),)})))
    again = load_server_config(path)
    assert token not in path.read_text()
    tenant = again.authenticate(token)
    assert tenant is not None and tenant.name == "a"


def test_tenant_runtimes_are_rooted_in_their_own_state_directories(tmp_path: Path) -> None:
    cfg = load_server_config(_write(tmp_path / "server.yaml", "state_dir: st\ntenants: [{name: a}, {name: b}]"))
    runtimes = TenantRuntimes(cfg)
    try:
        a, b = runtimes.get("a"), runtimes.get("b")
        assert runtimes.get("a") is a
        assert a.tool_store.tools_dir == tmp_path / "st" / "tenants" / "a" / "tools"
        assert b.tool_store.tools_dir == tmp_path / "st" / "tenants" / "b" / "tools"
        assert a.call_log.path == tmp_path / "st" / "tenants" / "a" / "logs" / "calls.jsonl"
        assert a.sessions.path.parent == tmp_path / "st" / "tenants" / "a"
        assert a.workspace.tool_store is a.tool_store
        assert a.workspace.sandbox is a.sandbox is not b.sandbox
    finally:
        runtimes.close()
    with pytest.raises(ConfigError):
        runtimes.get("nobody")


def test_metered_provider_stops_at_the_daily_quota() -> None:
    class Echo:
        name = "echo"

        def generate(self, request: GenerationRequest) -> object:
            return "program"

    provider = MeteredProvider(Echo(), DailyCounter(2))  # type: ignore[arg-type]
    request = GenerationRequest(role="r", method="m")
    provider.generate(request)
    provider.generate(request)
    with pytest.raises(ProviderError) as info:
        provider.generate(request)
    assert info.value.kind == "quota_exceeded" and not info.value.retriable
    assert provider.counter.exhausted
