"""`sandforge policy test` judges every example against the effective policy (issue 23): a layer that grants a
capability keeps its exit code about its own rules, `--layer` tests one layer, the summary is per layer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.cli import main
from sandforge.runtime.guardrails import layered_policy
from sandforge.runtime.guardrails.selftest import check_example, examples

ACME = Path(__file__).resolve().parents[2] / "policies" / "examples" / "acme"

# Exactly the deployment docs/policies.md shows: adds a rule, overrides one, grants http_fetch.
DEPLOYMENT = """\
policy: {name: deploy}
grant: [http_fetch]
rules:
  - id: no_random
    description: Imports of random.
    rationale: Tests must be deterministic.
    message: "{module} is not deterministic"
    required_correction: Do not import {module}; take randomness from args.
    match: {kind: import, modules: [random]}
    examples:
      trigger: [import random]
      clean: [import math]
override:
  dynamic_evaluation: {classification: terminal}
"""


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["policy", "test", *args])


def layer(tmp_path: Path, text: str, name: str = "deploy") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "policy.yaml").write_text(textwrap.dedent(text))
    return directory


def test_a_layer_that_grants_a_capability_passes_its_tests(tmp_path: Path) -> None:
    result = run(str(layer(tmp_path, DEPLOYMENT)))
    assert result.exit_code == 0, result.output
    assert " 0 failed in " in result.output and "3 skipped" in result.output
    assert "assumes http_fetch denied (as in layer default); a later layer grants it at" in result.output
    assert "policy.yaml:2" in result.output  # where the grant is
    assert "  deploy (" in result.output and ": 2 passed, 0 failed" in result.output  # its own line


def test_only_examples_that_would_fail_are_skipped(tmp_path: Path) -> None:
    policy = layered_policy([layer(tmp_path, DEPLOYMENT)])
    outcomes = {e.name: check_example(e, policy) for e in examples(policy)}
    skipped = sorted(name for name, o in outcomes.items() if o.status == "skipped")
    assert skipped == [
        "rule capability_not_granted trigger[1]",
        "rule capability_not_granted trigger[2]",
        "rule module_not_allowed trigger[0]",
    ]
    # uses http_fetch too (tool("web_fetcher")) but still holds: it counts as passed, not skipped
    assert outcomes["rule delegated_tool_mutation trigger[0]"].status == "passed"
    assert "would fail: did not trigger (found: egress_denied)" in outcomes[skipped[0]].detail


def test_a_denied_capability_is_a_change_too(tmp_path: Path) -> None:
    policy = layered_policy([layer(tmp_path, "deny: [json_parse]\n")])
    outcomes = [check_example(e, policy) for e in examples(policy)]
    notes = [o.detail for o in outcomes if o.status == "skipped"]
    assert notes and all("assumes json_parse granted" in n and "denies it" in n for n in notes)
    assert not [o for o in outcomes if o.status == "failed"]


def test_the_authors_own_failures_still_fail(tmp_path: Path) -> None:
    broken = DEPLOYMENT.replace("clean: [import math]", "clean: [import random]")
    result = run(str(layer(tmp_path, broken)), "-v")
    assert result.exit_code == 1
    assert "FAIL rule no_random clean[0]" in result.output
    assert "deploy (" in result.output and ": 1 passed, 1 failed" in result.output
    assert "SKIP rule capability_not_granted trigger[1]" in result.output


def test_layer_option_tests_one_layers_own_rules(tmp_path: Path) -> None:
    directory = layer(tmp_path, DEPLOYMENT)
    result = run(str(directory), "--layer", "deploy", "-v")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    assert {line.split()[2] for line in lines} == {"no_random", "dynamic_evaluation"}  # its rule and its override
    assert run(str(directory), "--layer", str(directory)).exit_code == 0  # by path too
    unknown = run(str(directory), "--layer", "nope")
    assert unknown.exit_code == 2 and "the layers are: default, deploy" in unknown.output


def test_json_summary_per_layer(tmp_path: Path) -> None:
    result = run("--policy", str(layer(tmp_path, DEPLOYMENT)), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["failed"], data["skipped"]) == (0, 3)
    by_name = {entry["name"]: entry for entry in data["layers"]}
    assert by_name["deploy"]["passed"] == 2 and by_name["default"]["skipped"] == 3
    statuses = {e["status"] for e in data["examples"]}
    assert statuses == {"passed", "skipped"}
    assert all(e["layer"] in ("default", "deploy") for e in data["examples"])


def test_the_shipped_example_deployment_passes() -> None:
    result = run(str(ACME))
    assert result.exit_code == 0, result.output
    assert "acme (" in result.output and "0 failed" in result.output


# --------------------------------------------------------------------------------------- sections

EGRESS = """\
grant: [http_fetch]
egress:
  allow:
    - url: "https://news.google.com/rss/**"
  examples:
    allow: [https://news.google.com/rss/x, HEAD https://news.google.com/rss/y]
    deny: [https://news.google.com/other, POST https://news.google.com/rss/x, http://10.0.0.1/rss/x]
"""


def test_egress_examples_run_and_fail_when_wrong(tmp_path: Path) -> None:
    ok = run(str(layer(tmp_path, EGRESS)), "-v")
    assert ok.exit_code == 0, ok.output
    for name in ("egress allow[0]", "egress allow[1]", "egress deny[0]", "egress deny[1]", "egress deny[2]"):
        assert f"PASS {name}" in ok.output
    wrong = EGRESS.replace("deny: [https://news.google.com/other", "deny: [https://news.google.com/rss/z")
    failed = run(str(layer(tmp_path, wrong, "wrong")), "-v")
    assert failed.exit_code == 1
    assert "FAIL egress deny[0]" in failed.output and "allowed (an allow entry admits it)" in failed.output


def test_resolve_and_the_deny_list_judge_egress_examples(tmp_path: Path) -> None:
    text = EGRESS + "  resolve: {news.google.com: 127.0.0.1}\n"
    denied = run(str(layer(tmp_path, text)), "-v")
    assert denied.exit_code == 1  # the allow examples now resolve to loopback: the deny list refuses them
    assert "FAIL egress allow[0]" in denied.output and "loopback" in denied.output
    exempt = text + "  allow_ranges: [127.0.0.1/32]\n"
    assert run(str(layer(tmp_path, exempt, "exempt"))).exit_code == 0


def test_a_later_allow_entry_skips_an_earlier_layers_deny_example(tmp_path: Path) -> None:
    result = run(str(layer(tmp_path, "egress:\n  allow: [{host: news.google.com}]\n")), "-v")
    assert result.exit_code == 0, result.output
    assert "SKIP egress deny[0]" in result.output  # the default layer's example, no longer true
    assert "holds under layer default's egress section" in result.output


def test_dependency_examples(tmp_path: Path) -> None:
    text = """\
    dependencies:
      allow: [lxml]
      examples:
        accept: [lxml>=5, [lxml, numpy]]
        refuse: [httpx, left-pad, "lxml @ https://example.com/lxml.whl"]
    """
    ok = run(str(layer(tmp_path, text)), "-v")
    assert ok.exit_code == 0, ok.output
    assert "PASS dependencies refuse[2]" in ok.output
    wrong = text.replace("refuse: [httpx,", "refuse: [lxml,")
    failed = run(str(layer(tmp_path, wrong, "wrong")), "-v")
    assert failed.exit_code == 1 and "FAIL dependencies refuse[0]" in failed.output


@pytest.mark.parametrize("bad", ["FETCH https://x.example/", "ftp://x.example/", "GET"])
def test_malformed_egress_examples_are_policy_problems(tmp_path: Path, bad: str) -> None:
    text = f"egress:\n  examples:\n    deny:\n      - {bad!r}\n"
    result = run(str(layer(tmp_path, text)))
    assert result.exit_code == 2
    assert "policy.yaml:4: egress.examples.deny[0]" in result.output


def test_a_later_layers_matchers_skip_an_earlier_untagged_example(tmp_path: Path) -> None:
    text = """\
    capabilities:
      json_parse:
        match:
          - {kind: call, functions: [json.dumps]}
        examples: {tagged: ["import json\\nx = json.dumps(1)"], untagged: ["x = 1"]}
    """
    result = run(str(layer(tmp_path, text)), "-v")
    assert result.exit_code == 0, result.output
    assert "SKIP capability json_parse untagged[0]" in result.output  # the default's `json.dumps` example
    assert "holds with the json_parse matchers up to layer default" in result.output
    assert "PASS capability json_parse tagged[" in result.output
    own = text.replace('untagged: ["x = 1"]', 'untagged: ["import json\\nx = json.dumps(2)"]')
    failed = run(str(layer(tmp_path, own, "own")), "-v")
    assert failed.exit_code == 1  # the layer's own untagged example contradicts its own matcher


def test_an_override_that_breaks_earlier_examples_fails_and_says_who(tmp_path: Path) -> None:
    text = "policy: {name: ov}\noverride:\n  forbidden_module:\n    match: {kind: import, modules: [ctypes]}\n"
    directory = layer(tmp_path, text, "ov")
    result = run(str(directory))
    assert result.exit_code == 1  # the override is the author's: the examples it breaks are failures
    assert f"the rule was changed by layer ov at {directory / 'policy.yaml'}:3" in result.output
    assert run(str(directory), "--layer", "ov").exit_code == 1  # and they are the layer's to test
