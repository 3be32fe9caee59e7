"""`policy check` judges literal URLs by the egress rules (issue 18): a denied one is terminal, naming why;
the allowed ones are the capability's evidence; the egress rules are part of the policy's fingerprint."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main as cli
from sandforge.runtime.guardrails import default_policy, load_policy, validate

NEWS = """
grant: [http_fetch]
egress:
  allow:
    - url: "https://news.google.com/rss/**"
      methods: [GET]
    - host: "*.yahoo.com"
"""


def layer(tmp_path: Path, text: str, name: str = "deploy") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "policy.yaml").write_text(textwrap.dedent(text))
    return directory


@pytest.fixture
def news_policy(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_policy([*default_policy().sources, layer(tmp_path, NEWS)])


def denied(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.message for v in result.violations if v.violation_type == "egress_denied"]


def test_an_allowed_literal_url_is_approved_and_is_evidence(news_policy) -> None:  # type: ignore[no-untyped-def]
    source = 'import requests\nreturn requests.get("https://news.google.com/rss/world").text'
    result = validate(source, news_policy)
    # not terminal: until the sandbox's broker-backed `requests` lands (issue 18), importing it is recoverable
    assert result.verdict != "terminal" and denied(result) == [], result.violations
    fetch = next(c for c in result.capabilities if c.tag == "http_fetch")
    assert any("news.google.com" in e.construct for e in fetch.evidence)


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ('requests.get("https://evil.example/x")', "no allow entry covers host evil.example"),
        ('requests.post("https://news.google.com/rss/world", data="x")', "method POST is not allowed"),
        ('requests.get("http://news.google.com/rss/world")', "no allow entry covers http"),
        ('requests.get("https://news.google.com/private")', "path /private"),
        ('urllib.request.urlopen("http://2130706433/")', "denied"),
        ('urllib.request.urlopen("https://user@news.google.com/rss/x")', "credentials in a URL"),
        ('requests.request("GET", "https://evil.example/")', "evil.example"),
    ],
)
def test_a_denied_literal_url_is_terminal_and_says_why(news_policy, call: str, why: str) -> None:  # type: ignore[no-untyped-def]
    source = f"import requests\nimport urllib.request\nreturn {call}"
    result = validate(source, news_policy)
    assert result.verdict == "terminal"
    [message] = denied(result)
    assert why in message and "egress policy denies" in message
    violation = next(v for v in result.violations if v.violation_type == "egress_denied")
    assert violation.location is not None and violation.location.line == 3
    assert "retrying another way will not help" in violation.required_correction


def test_an_address_literal_on_the_deny_list_is_terminal_even_when_its_host_entry_allows(tmp_path: Path) -> None:
    metadata = 'grant: [http_fetch]\negress:\n  allow:\n    - host: "169.254.169.254"\n      schemes: [http]\n'
    policy = load_policy([*default_policy().sources, layer(tmp_path, metadata)])
    result = validate('import requests\nreturn requests.get("http://169.254.169.254/latest/meta-data/").text', policy)
    assert result.verdict == "terminal"
    assert "link-local" in denied(result)[0]


def test_computed_urls_are_left_to_the_broker(news_policy) -> None:  # type: ignore[no-untyped-def]
    result = validate("import requests\nreturn requests.get(args[0]).text", news_policy)
    assert result.verdict != "terminal" and denied(result) == []


def test_without_the_grant_the_capability_violation_is_the_only_verdict() -> None:
    result = validate('import requests\nreturn requests.get("https://evil.example/").text', default_policy())
    assert result.verdict == "terminal"
    assert denied(result) == []
    assert "capability_not_granted" in [v.violation_type for v in result.violations]


def test_the_egress_rules_are_part_of_the_fingerprint(tmp_path: Path) -> None:
    base = default_policy()
    granted = load_policy([*base.sources, layer(tmp_path, "grant: [http_fetch]\n", "a")])
    with_allow = load_policy([*base.sources, layer(tmp_path, NEWS, "b")])
    other_allow = load_policy([*base.sources, layer(tmp_path, NEWS.replace("yahoo", "bing"), "c")])
    only_limits = load_policy([*base.sources, layer(tmp_path, "egress:\n  limits: {max_requests: 3}\n", "d")])
    assert len({granted.fingerprint, with_allow.fingerprint, other_allow.fingerprint}) == 3
    assert only_limits.fingerprint == base.fingerprint  # limits apply at run time: no verdict changes


def test_policy_check_reports_the_denial_and_the_reachable_host(tmp_path: Path) -> None:
    deploy = layer(tmp_path, NEWS)
    program = tmp_path / "p.py"
    program.write_text(
        "import requests\n"
        'feed = requests.get("https://news.google.com/rss/world").text\n'
        'other = requests.get("https://evil.example/feed").text\n'
        "return [feed, other]\n"
    )
    result = CliRunner().invoke(cli, ["policy", "check", str(program), "--policy", str(deploy), "--format", "json"])
    assert result.exit_code != 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "terminal"
    [violation] = [v for v in report["violations"] if v["violation_type"] == "egress_denied"]
    assert "evil.example" in violation["message"] and violation["location"]["line"] == 3
    fetch = next(c for c in report["capabilities"] if c["tag"] == "http_fetch")
    assert any("news.google.com" in e["construct"] for e in fetch["evidence"])
    assert not any("evil.example" in e["construct"] for e in fetch["evidence"])
