"""The egress and dependencies sections are first-class (issue 23): in the JSON Schema, shown by `policy list`,
explained by `policy explain`, and checked by `policy check` against the program before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from sandforge.runtime.guardrails import policy_json_schema

ACME = str(Path(__file__).resolve().parents[2] / "policies" / "examples" / "acme")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["policy", *args])


def test_schema_covers_the_sections_and_their_examples() -> None:
    schema = policy_json_schema()
    properties = schema["properties"]
    assert {"egress", "dependencies"} <= set(properties)
    defs = schema["$defs"]
    egress = defs["EgressSection"]["properties"]
    assert {"allow", "allow_ranges", "resolve", "limits", "credentials", "examples"} <= set(egress)
    assert set(defs["EgressExamples"]["properties"]) == {"allow", "deny"}
    assert set(defs["DependencyExamples"]["properties"]) == {"accept", "refuse"}
    assert {"allow", "block", "source", "wheelhouse", "max_env_mb", "examples"} <= set(
        defs["DependenciesSection"]["properties"]
    )


def test_list_shows_the_sections() -> None:
    result = run("list", "--policy", ACME)
    assert result.exit_code == 0, result.output
    assert "\negress:\n  allow: google-news (https://news.google.com/rss/**) [GET, HEAD]" in result.output
    assert "\ndependencies:\n  allow: beautifulsoup4, feedparser, lxml," in result.output
    default = run("list")
    assert "allow: nothing (every request is egress_denied)" in default.output


def test_list_json() -> None:
    data = json.loads(run("list", "--policy", ACME, "--json").stdout)
    assert data["egress"]["allow"][0]["url"] == "https://news.google.com/rss/**"
    assert "lxml" in data["dependencies"]["allowed"] and "requests" not in data["dependencies"]["allowed"]
    assert [layer["name"] for layer in data["layers"]] == ["default", "acme"]
    assert any(rule["id"] == "no_random" for rule in data["rules"])


def test_credential_values_are_never_listed(tmp_path: Path) -> None:
    layer = tmp_path / "creds.yaml"
    layer.write_text(
        "egress:\n  credentials:\n    - {host: api.example.com, header: Authorization, value: 'Bearer s3cret'}\n"
    )
    text = run("list", "--policy", str(layer)).output + run("list", "--policy", str(layer), "--json").output
    assert "Authorization for api.example.com" in text and "s3cret" not in text


@pytest.mark.parametrize(
    ("name", "pieces"),
    [
        ("egress", ["# egress", "http_fetch is granted", "allow: google-news", "platform deny list"]),
        ("dependencies", ["# dependencies", "allow: beautifulsoup4", "HTTP client libraries are never installed"]),
    ],
)
def test_explain_sections(name: str, pieces: list[str]) -> None:
    result = run("explain", name, "--policy", ACME)
    assert result.exit_code == 0, result.output
    for piece in pieces:
        assert piece in result.output


# ------------------------------------------------------------------------------------- policy check


def check(tmp_path: Path, source: str, *extra: str) -> tuple[int, dict[str, object]]:
    program = tmp_path / "program.py"
    program.write_text(source)
    result = run("check", str(program), "--policy", ACME, "--format", "json", *extra)
    data: dict[str, object] = json.loads(result.stdout)
    return result.exit_code, data


def _types(data: dict[str, object]) -> list[object]:
    violations = data["violations"]
    assert isinstance(violations, list)
    return [v["violation_type"] for v in violations]


def test_check_judges_literal_urls_by_the_egress_rules(tmp_path: Path) -> None:
    allowed, data = check(tmp_path, 'return fetch("https://news.google.com/rss/search?q=x").text\n')
    assert allowed == 0, data
    denied, data = check(tmp_path, 'return fetch("https://evil.example/x").text\n')
    assert denied == 4 and _types(data) == ["egress_denied"]


def test_check_judges_declared_packages(tmp_path: Path) -> None:
    header = '# /// script\n# dependencies = ["{}"]\n# ///\n'
    code, data = check(tmp_path, header.format("lxml>=5") + "import lxml\nreturn 1\n")
    assert code == 0, data
    assert data["declared"] == ["lxml"] and data["pending_imports"] == ["lxml"]
    code, data = check(tmp_path, header.format("left-pad") + "return 1\n")
    assert code == 3 and _types(data) == ["dependency_policy_violation"]
    violations = data["violations"]
    assert isinstance(violations, list) and violations[0]["location"]["line"] == 1
    code, data = check(tmp_path, header.format("lxml @ https://x.example/lxml.whl") + "return 1\n")
    assert code == 3 and _types(data) == ["invalid_dependency_manifest"]


def test_an_undeclared_third_party_import_is_reported(tmp_path: Path) -> None:
    code, data = check(tmp_path, "import lxml\nreturn 1\n")
    assert code == 3 and _types(data) == ["undeclared_import"]


def test_check_text_names_declared_and_pending(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text('# /// script\n# dependencies = ["lxml"]\n# ///\nimport lxml\nreturn 1\n')
    result = run("check", str(program), "--policy", ACME)
    assert result.exit_code == 0, result.output
    assert "declares lxml (allowed by the dependency rules)" in result.output
    assert "imports lxml: checked against the environment once built" in result.output


@pytest.mark.parametrize(("name", "kind"), [("no_random", "rule"), ("http_fetch", "capability"),
                                             ("egress", "section"), ("guardrail_error", "engine")])  # fmt: skip
def test_explain_json(name: str, kind: str) -> None:
    result = run("explain", name, "--policy", ACME, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["name"] == name and data["kind"] == kind and data["page"].startswith("# ")
    if kind == "rule":
        assert data["classification"] == "recoverable" and data["origin"].endswith("policy.yaml:14")
    if kind == "section":
        assert data["settings"]["allow"][0]["name"] == "google-news"


def test_json_is_format_json(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("return 1\n")
    assert json.loads(run("check", str(program), "--json").stdout)["verdict"] == "approved"
    assert json.loads(run("lint", ACME, "--json").stdout)["ok"] is True
