"""The egress section of policy files: validation with file and line, layering, the default, the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandforge.runtime.egress import EgressPolicy
from sandforge.runtime.errors import ConfigError
from sandforge.runtime.guardrails import default_policy, load_policy, policy_json_schema


def layer(tmp_path: Path, name: str, text: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "egress.yaml").write_text(text)
    return directory


def test_the_default_policy_allows_nothing() -> None:
    egress = default_policy().egress
    assert egress.allow == () and egress.allow_ranges == () and egress.credentials == ()
    assert egress == EgressPolicy()  # the file states the built-in defaults, nothing more


def test_layers_accumulate_and_override(tmp_path: Path) -> None:
    first = layer(
        tmp_path,
        "a",
        """
egress:
  allow:
    - url: "https://news.google.com/rss/**"
      methods: [GET]
  allow_ranges: [127.0.0.0/8]
  resolve: {news.google.com: 127.0.0.5}
  ca_file: certs/ca.pem
  limits: {max_requests: 3}
  credentials:
    - {host: api.example.com, header: Authorization, value: "Bearer ${EXAMPLE_TOKEN}"}
""",
    )
    second = layer(
        tmp_path,
        "b",
        """
egress:
  allow: [{host: "*.yahoo.com"}]
  resolve: {news.google.com: 127.0.0.6, rss.nytimes.com: "::1"}
  limits: {timeout_s: 2.5}
  credentials:
    - {host: api.example.com, header: authorization, value: "Bearer ${OTHER_TOKEN}"}
""",
    )
    egress = load_policy([first, second]).egress
    assert [entry.label() for entry in egress.allow] == ["https://news.google.com/rss/**", "host *.yahoo.com"]
    assert egress.allow_ranges == ("127.0.0.0/8",)
    assert egress.resolve == {"news.google.com": "127.0.0.6", "rss.nytimes.com": "::1"}
    assert egress.ca_file == str(first / "certs/ca.pem")  # relative to the file that named it
    assert (egress.limits.max_requests, egress.limits.timeout_s, egress.limits.max_redirects) == (3, 2.5, 5)
    assert [c.value for c in egress.credentials] == ["Bearer ${OTHER_TOKEN}"]  # same host and header: replaced
    reset = layer(tmp_path, "c", "egress: {reset: true, allow: [{host: only.example.com}]}\n")
    after = load_policy([first, second, reset]).egress
    assert [e.host for e in after.allow] == ["only.example.com"] and after.resolve == {} and after.ca_file is None
    assert after.limits.max_requests == 3  # limits survive a reset


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("egress: {allow: [{url: 'https://x.com/', host: x.com}]}", "exactly one of `url` and `host`"),
        ("egress: {allow: [{}]}", "exactly one of"),
        ("egress: {allow: [{url: 'ftp://x.com/'}]}", "expected http(s)://"),
        ("egress: {allow: [{url: 'https://x.com/', schemes: [http]}]}", "belong to `host` entries"),
        ("egress: {allow: [{host: 'x.com', methods: [CONNECT]}]}", "methods"),
        ("egress: {allow: [{host: 'a/b'}]}", "host pattern"),
        ("egress: {allow: [{host: '**.x.com'}]}", "host pattern"),
        ("egress: {allow_ranges: [not-a-cidr]}", "not a CIDR"),
        ("egress: {resolve: {'*.x.com': 1.2.3.4}}", "not a pattern"),
        ("egress: {resolve: {x.com: example.org}}", "not an IP address"),
        ("egress: {limits: {timeout_s: .nan}}", "timeout_s"),
        ("egress: {limits: {max_requests: -1}}", "max_requests"),
        ("egress: {credentials: [{host: x.com, header: 'A B', value: v}]}", "header name"),
        ("egress: {credentials: [{host: x.com, header: A, value: '${file:relative}'}]}", "absolute path"),
        ("egress: {credentials: [{host: x.com, header: A, value: '${BAD NAME}'}]}", "malformed reference"),
        ("egress: {unknown: 1}", "unknown"),
    ],
)
def test_malformed_sections_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    directory = layer(tmp_path, "bad", "# comment\n" + text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_policy([directory])
    assert "egress.yaml:2" in str(caught.value) and message.lower() in str(caught.value).lower()


def test_the_schema_describes_the_section() -> None:
    schema = policy_json_schema()
    section = schema["$defs"]["EgressSection"]["properties"]
    assert {"allow", "allow_ranges", "resolve", "ca_file", "limits", "credentials", "reset"} <= set(section)
    assert schema["properties"]["egress"]


def test_only_the_egress_rules_that_judge_literal_urls_change_the_fingerprint(tmp_path: Path) -> None:
    """Allow entries and ranges decide `egress_denied` at validation (tests/guardrails/test_egress_literals.py),
    so they are verdict inputs; limits, resolve overrides and credentials act only at run time."""
    base = default_policy()
    allow = layer(tmp_path, "e", "egress: {allow: [{host: x.com}]}\n")
    runtime_only = layer(
        tmp_path, "f", "egress: {limits: {max_requests: 3}, resolve: {x.com: 127.0.0.1}}\n"
    )
    assert load_policy([*base.sources, allow]).fingerprint != base.fingerprint
    assert load_policy([*base.sources, runtime_only]).fingerprint == base.fingerprint
