"""At least 95% of the compatibility corpus runs unchanged in the sandbox with CPython's answer, and none
gives a wrong answer (issue 15). Runs on the subprocess backend and on the docker backend."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from tests.compat import corpus

REQUIRED_SHARE = 0.95


def test_the_corpus_is_large_enough() -> None:
    assert len(corpus.load()) >= 100


def run_corpus(backend: str) -> list[corpus.Verdict]:
    """Each program in a fresh sandbox; three at a time, so one's start-up overlaps another's run."""
    programs = corpus.load()
    expected = corpus.reference(programs)

    def run(program: corpus.Program) -> corpus.Verdict:
        outcome = sb.execute(ExecutionRequest(code=program.code, args=program.args, kwargs=program.kwargs,
                                              context=program.context))  # fmt: skip
        return corpus.judge(program.name, expected[program.name], outcome)

    with Sandbox(SandboxConfig(backend=backend, pool_size=3)) as sb, ThreadPoolExecutor(max_workers=3) as threads:  # type: ignore[arg-type]
        return list(threads.map(run, programs))


@pytest.mark.timeout(900)  # 115 fresh sandboxes in a row (containers: ~1 s each on a loaded machine)
@pytest.mark.parametrize("backend", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_corpus_runs_unchanged(backend: str) -> None:
    verdicts = run_corpus(backend)
    wrong = [v for v in verdicts if v.kind == "wrong"]
    failed = [v for v in verdicts if v.kind == "fail"]
    share = sum(v.kind == "pass" for v in verdicts) / len(verdicts)
    report = "\n".join(f"{v.kind} {v.name}: {v.detail}" for v in wrong + failed)
    assert not wrong, report
    assert share >= REQUIRED_SHARE, f"{share:.1%} pass\n{report}"
