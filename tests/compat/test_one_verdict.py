"""One verdict (issue 15): what the policy approves is what the sandbox compiles, because validation runs
the sandbox's own restricted compilation; and `policy check` and `exec` read a file the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.guardrails.selftest import examples
from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig
from tests.compat import corpus

#: What a program the policy approved must never get from the sandbox: it was refused before running.
REFUSALS = {ErrorType.SANDBOX_VIOLATION, ErrorType.INVALID_CODE}

CLEAN = [e for e in examples(default_policy()) if e.expectation in ("clean", "untagged", "tagged")]


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=2)) as sandbox:
        yield sandbox


@pytest.mark.parametrize("example", CLEAN, ids=[e.name.replace(" ", ":") for e in CLEAN])
def test_every_clean_policy_example_runs_in_the_sandbox(sb: Sandbox, example: object) -> None:
    source = example.source  # type: ignore[attr-defined]
    if validate(source, default_policy()).verdict != "approved":
        pytest.skip("not approved by the whole policy (a clean example of one rule may break another)")
    out = sb.execute(ExecutionRequest(code=source))
    assert out.error_type not in REFUSALS, (out.error_type, out.error_message)


@pytest.mark.timeout(900)  # 159 executions in a row
def test_the_policy_and_the_sandbox_agree_on_the_corpus(sb: Sandbox) -> None:
    disagreements = []
    for program in corpus.load():
        approved = validate(program.code, default_policy()).verdict == "approved"
        out = sb.execute(ExecutionRequest(code=program.code, args=program.args, kwargs=program.kwargs,
                                          context=program.context))  # fmt: skip
        if approved and out.error_type in REFUSALS:
            disagreements.append(f"{program.name}: approved, then refused: {out.error_message}")
    assert not disagreements, "\n".join(disagreements)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("class A:\n    def __del__(self):\n        pass\nreturn 1", "__del__"),
        ("try:\n    pass\nexcept* ValueError:\n    pass\nreturn 1", "TryStar"),
        ("def f():\n    pass\nf.__name__ = 'g'\nreturn 1", "can be read but not set"),
        ("match 'x':\n    case str(format=f):\n        pass\nreturn 1", "format"),
        ("class A:\n    return 1", "outside function"),
    ],
)
def test_what_the_sandbox_refuses_is_a_recoverable_violation_with_a_location(source: str, needle: str) -> None:
    result = validate(source, default_policy())
    assert result.verdict == "recoverable"
    hits = [v for v in result.violations if needle in v.message]
    assert hits, [v.message for v in result.violations]
    assert all(v.location is not None and v.location.line >= 1 and v.required_correction for v in hits)


def test_a_sandbox_refusal_says_how_to_fix_it() -> None:
    result = validate("import random\nreturn random.Random()._secret", default_policy())
    restriction = [v for v in result.violations if v.violation_type in ("sandbox_restriction", "private_attribute")]
    assert restriction and "underscore" in restriction[0].required_correction.lower()


def test_policy_check_and_exec_agree_on_a_byte_order_mark(tmp_path: Path) -> None:
    program = tmp_path / "bom.py"
    program.write_bytes(b"\xef\xbb\xbfreturn args[0] + 1\n")
    runner = CliRunner()
    checked = runner.invoke(main, ["policy", "check", str(program)])
    assert checked.exit_code == 0, checked.output
    ran = runner.invoke(main, ["exec", str(program), "--backend", "subprocess", "--args", "[1]", "--json"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.output)["value"] == 2
