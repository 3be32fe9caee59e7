"""Every problem of a policy is reported in one run (issue 23): file, line, key path, message and hint, sorted
by file and line, as text, JSON and SARIF; a broken rule does not hide the rest of the file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandforge.runtime.cli import main
from sandforge.runtime.errors import ConfigError
from sandforge.runtime.guardrails import layered_policy
from sandforge.runtime.guardrails.problems import MAX_PROBLEMS, PolicyError, Problem, sort_problems

ACME = Path(__file__).resolve().parents[2] / "policies" / "examples" / "acme"

A = """\
rules:
  - id: no_random
    description: Imports of random.
    match: {kind: import, modules: [random]}
    examples: {trigger: [import random], clean: [import math]}
  - id: no_time
    description: Imports of time.
    rationle: typo
    rationale: ok
    message: "{module} bad"
    required_correction: Do not.
    match: {kind: imprt, modules: [time]}
    examples: {trigger: [import time], clean: [import math]}
  - id: no_zlib
    description: Imports of zlib.
    rationale: For the test.
    message: "{modul} is refused"
    required_correction: Do not import {module}.
    match: {kind: import, modules: [zlib]}
    examples: {trigger: [import zlib], clean: [import math]}
override:
  no_random: {classification: terminal}
  forbidden_modul: {enabled: false}
grant: [teleport]
"""
B = """\
limits:
  max_source_bytes: 12
disable: [nope]
"""
C = "rules: [\n  - id: x\n"

#: (file, line, key path, start of the message, a piece of the hint) in the order they must come out
EXPECTED = [
    ("a.yaml", 2, "rules[0]", "missing required fields: rationale, message, required_correction", "required fields"),
    ("a.yaml", 8, "rules[1].rationle", "Extra inputs are not permitted", "did you mean 'rationale'?"),
    ("a.yaml", 12, "rules[1].match.kind", "unknown kind 'imprt'", "kinds: attribute, call"),
    ("a.yaml", 17, "rules[2].message", "rule 'no_zlib': unknown placeholder {modul}", None),
    ("a.yaml", 23, "override.forbidden_modul", "cannot override unknown rule", "did you mean 'forbidden_module'?"),
    ("a.yaml", 24, "grant[0]", "unknown capability 'teleport'", None),
    ("b.yaml", 2, "limits.max_source_bytes", "Input should be greater than or equal to 1024", None),
    ("b.yaml", 3, "disable[0]", "cannot disable unknown rule 'nope'", None),
    ("c.yaml", 2, "", "did not find expected node content", None),
]


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    directory = tmp_path / "broken"
    directory.mkdir()
    for name, text in (("a.yaml", A), ("b.yaml", B), ("c.yaml", C)):
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def _problems(directory: Path) -> tuple[Problem, ...]:
    with pytest.raises(PolicyError) as info:
        layered_policy([directory])
    return info.value.problems


def test_every_problem_in_one_load_sorted_by_file_and_line(broken: Path) -> None:
    problems = _problems(broken)
    assert len(problems) == len(EXPECTED), "\n".join(map(str, problems))
    for problem, (file, line, path, message, hint) in zip(problems, EXPECTED, strict=True):
        assert (Path(problem.file).name, problem.line, problem.path) == (file, line, path), problem
        assert problem.message.startswith(message), problem
        if hint is not None:
            assert problem.hint is not None and hint in problem.hint, problem


def test_a_broken_rule_is_not_reported_again_as_unknown(broken: Path) -> None:
    # `override: no_random` names a rule left out for its missing fields: one problem, not a second one
    assert not [p for p in _problems(broken) if "'no_random'" in p.message]


def test_the_error_is_a_config_error_with_one_line(broken: Path) -> None:
    with pytest.raises(ConfigError) as info:
        layered_policy([broken])
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{broken / 'a.yaml'}:2: rules[0]: missing required fields")
    assert "and 8 more problems, all listed by `sandforge policy lint`" in text


def test_lint_prints_one_line_per_problem(broken: Path) -> None:
    result = CliRunner().invoke(main, ["policy", "lint", str(broken)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == len(EXPECTED) and all(line.startswith("error: ") for line in lines)
    assert lines[1] == (
        f"error: {broken / 'a.yaml'}:8: rules[1].rationle: Extra inputs are not permitted "
        "(hint: did you mean 'rationale'?)"
    )


def test_lint_json_and_sarif(broken: Path) -> None:
    as_json = CliRunner().invoke(main, ["policy", "lint", str(broken), "--format", "json"])
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["ok"] is False
    assert [(Path(p["file"]).name, p["line"], p["path"]) for p in data["problems"]] == [e[:3] for e in EXPECTED]
    assert set(data["problems"][0]) == {"file", "line", "path", "message", "hint"}
    sarif = CliRunner().invoke(main, ["policy", "lint", str(broken), "--format", "sarif"])
    log = json.loads(sarif.stdout)
    assert log["version"] == "2.1.0"
    results = log["runs"][0]["results"]
    assert [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in results] == [e[1] for e in EXPECTED]
    assert results[1]["properties"]["hint"] == "did you mean 'rationale'?"


def test_policy_check_reports_problems_in_its_format(broken: Path, tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("return 1\n")
    result = CliRunner().invoke(main, ["policy", "check", str(program), "--policy", str(broken), "--format", "sarif"])
    assert result.exit_code == 2
    assert len(json.loads(result.stdout)["runs"][0]["results"]) == len(EXPECTED)


def test_a_clean_policy_lints_clean(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text("grant: [http_fetch]\n")
    result = CliRunner().invoke(main, ["policy", "lint", str(tmp_path / "ok.yaml"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True


def test_problems_across_layers_come_in_layer_order(tmp_path: Path) -> None:
    first, second = tmp_path / "z_first", tmp_path / "a_second"
    for directory, text in ((first, "disable: [nope]\n"), (second, "grant: [teleport]\n")):
        directory.mkdir()
        (directory / "p.yaml").write_text(text)
    problems = _problems_of([first, second])
    assert [Path(p.file).parent.name for p in problems] == ["z_first", "a_second"]


def _problems_of(layers: list[Path]) -> tuple[Problem, ...]:
    with pytest.raises(PolicyError) as info:
        layered_policy(layers)
    return info.value.problems


def test_missing_layers_are_problems_too(tmp_path: Path) -> None:
    problems = _problems_of([tmp_path / "nope", tmp_path / "nope2"])
    assert [p.message for p in problems] == [
        f"policy directory {tmp_path / 'nope'} does not exist",
        f"policy directory {tmp_path / 'nope2'} does not exist",
    ]


def test_problem_lists_are_bounded_and_deduplicated() -> None:
    many = [Problem("f.yaml", line, "", "x") for line in range(MAX_PROBLEMS + 50)]
    assert len(sort_problems([*many, *many])) == MAX_PROBLEMS


def test_a_key_cannot_forge_extra_problem_lines(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text('"rulez\\nerror: forged.yaml:1: all good": []\noverride: {"x\\ny": {}}\n')
    result = CliRunner().invoke(main, ["policy", "lint", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"error: {tmp_path / 'p.yaml'}:") for line in lines), lines


# ------------------------------------------------------------------------------ mutations never crash

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "random", "{modul}", "import os"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["kind", "id", "x"]), inner),
    max_leaves=6,
)


def _paths(data: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out += _paths(value, (*prefix, index))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_policies_give_problems_never_a_crash(tmp_path: Path, data: st.DataObject) -> None:
    document = yaml.safe_load((ACME / "policy.yaml").read_text())
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(_paths(document)[1:]))
        parent = document
        for part in path[:-1]:
            parent = parent[part]  # type: ignore[index]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(_VALUES)  # type: ignore[index]
        elif isinstance(parent, dict):
            del parent[path[-1]]
    target = tmp_path / "mutated.yaml"
    target.write_text(yaml.safe_dump(document))
    try:
        layered_policy([target])
    except PolicyError as exc:
        assert exc.problems and "\n" not in str(exc)
        for problem in exc.problems:
            assert problem.file == str(target) and problem.line >= 1 and "\n" not in str(problem)


def test_policy_test_json_lists_the_problems(broken: Path) -> None:
    result = CliRunner().invoke(main, ["policy", "test", str(broken), "--json"])
    assert result.exit_code == 2
    assert len(json.loads(result.stdout)["problems"]) == len(EXPECTED)
