"""At least 99% of the compatibility corpus runs unchanged in the sandbox with CPython's answer, and none
gives a wrong answer (issue 15; issue 38 added 44 agent tools written with the idioms models use: private
state, namedtuples, type names, their own decorators, forward references, logging, uuid, zoneinfo, asyncio,
configparser, RFC 2822 dates), and none trips the tripwire (issue 36: containers import allowed modules
lazily, after the hook is armed). Runs on every backend."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from tests.compat import corpus
from tests.conftest import BACKEND_PARAMS

REQUIRED_SHARE = 0.99


def test_the_corpus_is_large_enough() -> None:
    assert len(corpus.load()) >= 155


def run_corpus(backend: str) -> list[corpus.Verdict]:
    """Each program in a fresh sandbox, three at a time (one's start-up overlaps another's run); a program
    the tripwire stopped is a ``wrong`` one, whatever CPython said."""
    programs = corpus.load()
    expected = corpus.reference(programs)

    def run(program: corpus.Program) -> corpus.Verdict:
        outcome = sb.execute(ExecutionRequest(code=program.code, args=program.args, kwargs=program.kwargs,
                                              context=program.context))  # fmt: skip
        event = outcome.security_event
        if event is not None and event.source == "tripwire":
            return corpus.Verdict(program.name, "wrong", f"tripped: {event.event}: {event.detail}")
        return corpus.judge(program.name, expected[program.name], outcome)

    config = SandboxConfig(backend=backend, pool_size=3)  # type: ignore[arg-type]
    with Sandbox(config) as sb, ThreadPoolExecutor(max_workers=3) as threads:
        return list(threads.map(run, programs))


@pytest.mark.timeout(1200)  # 159 fresh sandboxes in a row (containers: ~1 s each on a loaded machine)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_the_corpus_runs_unchanged(backend: str) -> None:
    verdicts = run_corpus(backend)
    wrong = [v for v in verdicts if v.kind == "wrong"]
    failed = [v for v in verdicts if v.kind == "fail"]
    share = sum(v.kind == "pass" for v in verdicts) / len(verdicts)
    report = "\n".join(f"{v.kind} {v.name}: {v.detail}" for v in wrong + failed)
    assert not wrong, report
    assert share >= REQUIRED_SHARE, f"{share:.1%} pass\n{report}"
