"""Policy loading: line-precise errors for malformed files, layering, grants, fingerprints."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from sandforge.runtime.errors import ConfigError
from sandforge.runtime.guardrails import default_policy, default_policy_dir, layered_policy, load_policy, validate
from sandforge.runtime.guardrails.selftest import run_examples

RULE = """\
rules:
  - id: no_random
    description: Imports of random.
    rationale: Tests must be deterministic.
    message: "{module} is not deterministic"
    required_correction: Do not import {module}.
    match:
      kind: import
      modules: [random]
    examples:
      trigger: [import random]
      clean: [import math]
"""


def layer(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    directory = tmp_path / "layer"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return directory


def error_for(tmp_path: Path, text: str) -> str:
    directory = layer(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        layered_policy([directory])
    return str(info.value)


# ------------------------------------------------------------------------------------ malformed files


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        pytest.param("rules: [\n  - id: x\n", 2, "did not find expected node content", id="yaml syntax"),
        pytest.param("grant: [json_parse]\ngrant: [csv_parse]\n", 2, "duplicate key 'grant'", id="duplicate key"),
        pytest.param("- a\n- b\n", 1, "must be a mapping", id="not a mapping"),
        pytest.param("rulez: []\n", 1, "rulez: Extra inputs are not permitted", id="unknown section"),
        pytest.param(RULE.replace("kind: import", "kind: imprt"), 8, "unknown kind 'imprt'", id="unknown kind"),
        pytest.param(RULE.replace("      modules: [random]\n", ""), 7, "modules", id="missing matcher field"),
        pytest.param(RULE.replace("  - id: no_random", "  - id: No-Random"), 2, "rules[0].id", id="bad id"),
        pytest.param(
            RULE.replace("classification", "x").replace("    rationale:", "    classification: fatal\n    rationale:"),
            4,
            "classification: Input should be 'recoverable' or 'terminal'",
            id="bad classification",
        ),
        pytest.param(
            RULE.replace("      clean: [import math]\n", ""), 10, "examples.clean: Field required", id="missing clean"
        ),
        pytest.param(
            RULE.replace("{module} is not", "{modul} is not"), 5, "unknown placeholder {modul}", id="template"
        ),
        pytest.param(
            RULE.replace("Do not import {module}.", "Do not import {module!r}."),
            6,
            "may not have a conversion",
            id="template conversion",
        ),
        pytest.param(
            "override:\n  no_such_rule:\n    enabled: false\n", 2, "unknown rule 'no_such_rule'", id="override"
        ),
        pytest.param(
            "disable:\n  - dunder_attribute\n  - nope\n", 3, "cannot disable unknown rule 'nope'", id="disable"
        ),
        pytest.param("grant:\n  - json_parse\n  - teleport\n", 3, "unknown capability 'teleport'", id="grant"),
        pytest.param(
            "rules:\n  - id: forbidden_module\n" + RULE.split("\n", 2)[2],
            2,
            "already defined at",
            id="duplicate rule",
        ),
        pytest.param(
            RULE.replace("kind: import\n      modules: [random]", "kind: plugin\n      plugin: nope"),
            9,
            "unknown plugin 'nope'",
            id="unknown plugin",
        ),
        pytest.param(
            RULE.replace(
                "kind: import\n      modules: [random]",
                "kind: plugin\n      plugin: delegated_tool_mutation\n      options:\n        factories: 3",
            ),
            11,
            "options.factories",
            id="plugin options",
        ),
        pytest.param("limits:\n  max_source_bytes: 12\n", 2, "greater than or equal to 1024", id="limits"),
        pytest.param("? [a, b]\n: 1\n", 1, "mapping keys must be strings", id="non-string key"),
        pytest.param("a: &a [*a]\n", 1, "", id="recursive alias"),
        pytest.param("x: !!python/object:os.system {}\n", 1, "unsupported YAML tag", id="unsafe tag"),
        pytest.param("x: !!python/name:os.system ''\n", 1, "could not determine a constructor", id="unsafe scalar"),
    ],
)
def test_malformed_policy_names_file_line_and_problem(tmp_path: Path, text: str, line: int, problem: str) -> None:
    message = error_for(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'layer' / 'policy.yaml'}:{line}: "), message
    assert problem in message


def test_not_utf8(tmp_path: Path) -> None:
    directory = tmp_path / "layer"
    directory.mkdir()
    (directory / "p.yaml").write_bytes(b"policy:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:2: policy file is not valid UTF-8"):
        load_policy([directory])


def test_missing_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("no policy here")
    with pytest.raises(ConfigError, match=r"has no \.yaml files"):
        load_policy([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="no policy layers"):
        load_policy([])


def test_alias_bombs_are_bounded(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    message = error_for(tmp_path, "\n".join(lines) + "\n")
    assert "too many YAML nodes" in message


def test_cli_prints_config_errors_as_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sandforge.runtime.cli import main

    directory = layer(tmp_path, RULE.replace("kind: import", "kind: imprt"))
    program = tmp_path / "p.py"
    program.write_text("x = 1\n")
    result = CliRunner().invoke(main, ["policy", "check", str(program), "--policy", str(directory)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and ":8: " in result.stderr
    assert "Traceback" not in result.output + result.stderr


# ------------------------------------------------------------------------------------------ layering


def test_a_layer_adds_a_rule_with_examples(tmp_path: Path) -> None:
    policy = layered_policy([layer(tmp_path, RULE)])
    result = validate("import random\n", policy)
    assert [(v.violation_type, v.message) for v in result.violations] == [("no_random", "random is not deterministic")]
    assert all(outcome.passed for outcome in run_examples(policy))


def test_files_in_a_layer_apply_in_path_order(tmp_path: Path) -> None:
    directory = layer(tmp_path, RULE, "a.yaml")
    (directory / "sub").mkdir()
    (directory / "sub" / "b.yaml").write_text("override:\n  no_random:\n    classification: terminal\n")
    policy = layered_policy([directory])
    assert policy.rule("no_random") is not None
    assert validate("import random\n", policy).verdict == "terminal"


def test_override_changes_only_the_given_fields(tmp_path: Path) -> None:
    text = """\
    override:
      forbidden_module:
        classification: terminal
        message: "{module} is banned here"
    """
    policy = layered_policy([layer(tmp_path, text)])
    rule = policy.rule("forbidden_module")
    assert rule is not None and rule.changed_at
    violation = next(v for v in validate("import os\n", policy).violations if v.violation_type == "forbidden_module")
    assert (violation.classification, violation.message) == ("terminal", "os is banned here")
    assert violation.required_correction == default_policy().rule("forbidden_module").correction.render(  # type: ignore[union-attr]
        {"module": "os"}
    )


def test_override_can_replace_a_matcher(tmp_path: Path) -> None:
    text = """\
    override:
      interactive_builtin:
        match: {kind: name, names: [input]}
    """
    policy = layered_policy([layer(tmp_path, text)])
    assert validate("help()\n", policy).verdict == "approved"
    assert validate("input()\n", policy).verdict == "recoverable"


def test_disable_and_re_enable(tmp_path: Path) -> None:
    first = layer(tmp_path, "disable: [dunder_attribute]\n")
    policy = layered_policy([first])
    # the rule is off; the sandbox's own compiler still refuses the read (one verdict, issue 15)
    found = [v.violation_type for v in validate("x = args.__class__\n", policy).violations]
    assert found == ["sandbox_restriction"]
    second = tmp_path / "second"
    second.mkdir()
    (second / "p.yaml").write_text("override:\n  dunder_attribute:\n    enabled: true\n")
    found = [v.violation_type for v in validate("x = args.__class__\n", layered_policy([first, second])).violations]
    assert found == ["dunder_attribute"]


def test_grant_and_deny_capabilities(tmp_path: Path) -> None:
    fetching = "page = tool('web_fetcher').fetch(url=args[0])\n"
    assert validate(fetching, default_policy()).verdict == "terminal"
    granted = layered_policy([layer(tmp_path, "grant: [http_fetch]\ndeny: [json_parse]\n")])
    result = validate(fetching, granted)
    assert result.verdict == "approved"
    assert [(c.tag, c.granted) for c in result.capabilities] == [("http_fetch", True), ("tool_delegation", True)]
    parsing = validate("import json\nreturn json.loads(args[0])\n", granted)
    assert parsing.verdict == "terminal"
    assert (
        parsing.violations[0].message == "capability not supported by runtime policy: json_parse (json.loads(args[0]))"
    )


def test_a_layer_extends_a_capability(tmp_path: Path) -> None:
    text = """\
    capabilities:
      http_fetch:
        match:
          - {kind: import, modules: [acme.http]}
        examples:
          tagged: [import acme.http]
          untagged: [import acme.cache]
    """
    policy = layered_policy([layer(tmp_path, text)])
    assert "http_fetch" in validate("import acme.http\n", policy).capability_tags
    assert "http_fetch" in validate("import requests\n", policy).capability_tags  # the default matchers remain
    assert policy.capabilities["http_fetch"].tagged[-1] == "import acme.http"


def test_limits_layer_field_by_field(tmp_path: Path) -> None:
    policy = layered_policy([layer(tmp_path, "limits:\n  max_violations: 2\n")])
    assert policy.limits.max_violations == 2
    assert policy.limits.max_source_bytes == default_policy().limits.max_source_bytes
    result = validate("eval('1')\n" * 5, policy)
    assert len(result.violations) == 2 and result.truncated


def test_policy_name_and_sources(tmp_path: Path) -> None:
    directory = layer(tmp_path, "policy:\n  name: acme\n")
    policy = load_policy([*default_policy().sources, directory])
    assert policy.name == "acme"
    assert policy.layers == (str(default_policy_dir()), str(directory))
    assert layered_policy([directory], include_default=False).rules == ()


# -------------------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable_and_independent_of_paths(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(str(default_policy_dir()), copy)
    assert load_policy([copy]).fingerprint == default_policy().fingerprint
    assert load_policy([default_policy_dir()]).fingerprint == default_policy().fingerprint
    assert default_policy().fingerprint.startswith("sha256:") and len(default_policy().fingerprint) == 71


def test_fingerprint_tracks_what_changes_verdicts(tmp_path: Path) -> None:
    base = default_policy().fingerprint
    docs_only = layered_policy([layer(tmp_path, "override:\n  dunder_attribute:\n    rationale: Because.\n")])
    assert docs_only.fingerprint == base
    for text in (
        "override:\n  dunder_attribute:\n    message: 'no {attribute}'\n",
        "disable: [dunder_attribute]\n",
        "grant: [http_fetch]\n",
        "limits:\n  max_ast_depth: 100\n",
    ):
        other = tmp_path / str(abs(hash(text)))
        other.mkdir()
        (other / "p.yaml").write_text(text)
        assert layered_policy([other]).fingerprint != base, text
    assert validate("x = 1", default_policy()).policy_fingerprint == base
