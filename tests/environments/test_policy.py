"""The `dependencies:` policy section: validation, layering, the schema, and the name checks."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandforge.runtime.environments.errors import DependencyPolicyViolation
from sandforge.runtime.environments.policy import HTTP_CLIENTS, DependenciesSection, DependencyPolicy
from sandforge.runtime.errors import ConfigError
from sandforge.runtime.guardrails import default_policy, load_policy


def _layer(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "deps.yaml").write_text(text)
    return folder


def test_the_default_policy_allows_the_issues_list_and_installs_from_the_index() -> None:
    deps = default_policy().dependencies
    for name in ("python-dateutil", "beautifulsoup4", "soupsieve", "feedparser", "numpy", "pandas", "pyyaml"):
        assert name in deps.allowed
    assert deps.source == "index"
    assert deps.wheelhouse is None
    assert deps.max_env_mb == 500
    assert not set(deps.allowed) & HTTP_CLIENTS


def test_no_section_allows_nothing() -> None:
    with pytest.raises(DependencyPolicyViolation, match="not in the policy's allow list"):
        DependencyPolicy().check(["six"])


def test_layers_accumulate_and_later_values_win(tmp_path: Path) -> None:
    first = _layer(tmp_path, "a", "dependencies:\n  allow: [Six]\n  block: [numpy]\n  max_env_mb: 50\n")
    second = _layer(tmp_path, "b", "dependencies:\n  allow: [attrs]\n  source: offline\n  wheelhouse: wheels\n")
    policy = load_policy([*default_policy().sources, first, second]).dependencies
    assert {"six", "attrs", "pandas"} <= set(policy.allow)
    assert "numpy" in policy.block and "numpy" not in policy.allowed  # block wins over allow
    assert policy.max_env_mb == 50
    assert policy.source == "offline"
    assert policy.wheelhouse == str(second / "wheels")  # relative to the file that says it


def test_reset_forgets_earlier_allow_and_block(tmp_path: Path) -> None:
    layer = _layer(tmp_path, "a", "dependencies:\n  reset: true\n  allow: [six]\n")
    policy = load_policy([*default_policy().sources, layer]).dependencies
    assert policy.allow == ("six",)
    assert policy.source == "index"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dependencies:\n  allow: [requests]\n", "HTTP client"),
        ("dependencies:\n  allow: [URLLIB3]\n", "HTTP client"),
        ("dependencies:\n  allow: ['bad name!']\n", "not a distribution name"),
        ("dependencies:\n  source: ftp://mirror/simple\n", "expected `index`"),
        ("dependencies:\n  max_env_mb: 0\n", "max_env_mb"),
        ("dependencies:\n  allow: [six]\n  extra: 1\n", "extra"),
    ],
)
def test_bad_sections_are_config_errors_naming_the_file(tmp_path: Path, text: str, words: str) -> None:
    layer = _layer(tmp_path, "bad", text)
    with pytest.raises(ConfigError, match=words) as caught:
        load_policy([*default_policy().sources, layer])
    assert "deps.yaml" in str(caught.value)


def test_the_published_schema_has_the_section() -> None:
    schema = json.loads((files("sandforge.policies") / "policy.schema.json").read_text(encoding="utf-8"))
    assert "dependencies" in schema["properties"]
    assert "DependenciesSection" in schema["$defs"]
    assert set(schema["$defs"]["DependenciesSection"]["properties"]) == {
        "reset", "allow", "block", "source", "wheelhouse", "max_env_mb", "examples"
    }  # fmt: skip  # examples: manifests `policy test` runs (issue 23)


def test_declared_names_are_checked_blocked_first() -> None:
    policy = DependencyPolicy(allow=("six", "numpy"), block=("numpy",))
    policy.check(["six"])
    with pytest.raises(DependencyPolicyViolation) as caught:
        policy.check(["numpy", "requests", "pandas", "six"])
    exc = caught.value
    assert exc.kind == "dependency_policy_violation"
    assert exc.names == ("numpy", "pandas", "requests")
    assert exc.allowed == ("six",)
    text = str(exc)
    assert "numpy: blocked" in text and "pandas: not in the policy's allow list" in text
    assert "requests: an HTTP client library" in text and "allowed distributions: six" in text


def test_http_clients_are_refused_even_if_a_policy_object_lists_them() -> None:
    forged = DependencyPolicy(allow=("requests", "httpx"))  # the section validator refuses this in files
    with pytest.raises(DependencyPolicyViolation, match="HTTP client"):
        forged.check(["httpx"])
    assert forged.allowed == ()


def test_section_model_normalises_names() -> None:
    section = DependenciesSection(allow=["Python_Dateutil", "python-dateutil"], block=["PyYAML"])
    assert section.allow == ["python-dateutil"]
    assert section.block == ["pyyaml"]
    with pytest.raises(ValidationError):
        DependenciesSection(source="index ")
