"""At least 99% of the compatibility corpus runs unchanged in the sandbox with CPython's answer, and none
gives a wrong answer (issue 15; issue 38 added 44 agent tools written with the idioms models use: private
state, namedtuples, type names, their own decorators, forward references, logging, uuid, zoneinfo, asyncio,
configparser, RFC 2822 dates). Runs on the subprocess backend and on the docker backend."""

from __future__ import annotations

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from tests.compat import corpus

REQUIRED_SHARE = 0.99


def test_the_corpus_is_large_enough() -> None:
    assert len(corpus.load()) >= 155


def run_corpus(backend: str) -> list[corpus.Verdict]:
    programs = corpus.load()
    expected = corpus.reference(programs)
    verdicts = []
    with Sandbox(SandboxConfig(backend=backend, pool_size=2)) as sb:  # type: ignore[arg-type]
        for program in programs:
            outcome = sb.execute(ExecutionRequest(code=program.code, args=program.args, kwargs=program.kwargs,
                                                  context=program.context))  # fmt: skip
            verdicts.append(corpus.judge(program.name, expected[program.name], outcome))
    return verdicts


@pytest.mark.timeout(1200)  # 159 fresh sandboxes in a row (containers: ~1 s each on a loaded machine)
@pytest.mark.parametrize("backend", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_corpus_runs_unchanged(backend: str) -> None:
    verdicts = run_corpus(backend)
    wrong = [v for v in verdicts if v.kind == "wrong"]
    failed = [v for v in verdicts if v.kind == "fail"]
    share = sum(v.kind == "pass" for v in verdicts) / len(verdicts)
    report = "\n".join(f"{v.kind} {v.name}: {v.detail}" for v in wrong + failed)
    assert not wrong, report
    assert share >= REQUIRED_SHARE, f"{share:.1%} pass\n{report}"
