"""``sandforge exec`` (and everything else that runs a program through ``execute_program``: ``POST /v1/exec``,
MCP ``exec``) is traced like an agent's attempt: a ``sandforge.exec`` span with validate, execute, sandbox
acquisition and one client span per egress request as children, and no secret in any attribute."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from sandforge.runtime.agent.egress import StandaloneBridge
from sandforge.runtime.agent.program_exec import execute_program, execute_program_async
from sandforge.runtime.cli import main
from sandforge.runtime.guardrails import default_policy
from sandforge.sandbox import AsyncSandbox, ExecutionRequest, Sandbox, SandboxConfig
from tests.egress import servers
from tests.telemetry.conftest import Otel, loopback_egress_policy

SECRET = "s3cr3t-exec-token-0123456789"


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert parent.context is not None
    return span.parent is not None and span.parent.span_id == parent.context.span_id


def no_secret(otel: Otel) -> None:
    for span in otel.spans():
        text = json.dumps([attrs(span), [dict(e.attributes or {}) for e in span.events], span.status.description])
        assert SECRET not in text, span.name


def test_an_exec_with_fetches_is_a_span_tree_without_secrets(
    otel: Otel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = servers.start()
    try:
        monkeypatch.setenv("OTEL_TEST_EXEC_TOKEN", SECRET)
        policy = loopback_egress_policy(tmp_path / "policy", server.port, "OTEL_TEST_EXEC_TOKEN")
        code = (
            f"r = fetch('http://allowed.test:{server.port}/echo?key={SECRET}x')\n"
            "try:\n    fetch(kwargs['elsewhere'])\nexcept Exception:\n    pass\n"
            "context['seen'] = args[0]\nreturn r.status\n"
        )
        request = ExecutionRequest(
            code=code, args=[SECRET], kwargs={"elsewhere": f"http://denied.test:{server.port}/x"}
        )
        bridge = StandaloneBridge.of(policy)
        with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
            outcome, _ = execute_program(sb, request, policy=policy, bridge=bridge)
    finally:
        server.close()
    assert outcome.ok and outcome.value == 200, outcome
    root = otel.one("sandforge.exec")
    assert root.parent is None and attrs(root)["sandforge.status"] == "ok"
    assert attrs(root)["sandforge.verdict"] == "approved" and attrs(root)["sandforge.backend"] == "subprocess"
    validate, execute = otel.one("sandforge.validate"), otel.one("sandforge.execute")
    assert child_of(validate, root) and child_of(execute, root)
    assert "http_fetch" in attrs(validate)["sandforge.capabilities"]
    assert child_of(otel.one("sandforge.sandbox.acquire"), execute)
    assert attrs(execute)["sandforge.ok"] is True and attrs(execute)["sandforge.sandbox.start"] == "cold"
    requests = otel.named("sandforge.egress")
    assert [attrs(s)["sandforge.egress.decision"] for s in requests] == ["allowed", "denied"]
    assert all(child_of(s, execute) and s.kind is SpanKind.CLIENT for s in requests)
    allowed, denied = requests
    assert attrs(allowed)["server.address"] == "allowed.test" and attrs(allowed)["http.response.status_code"] == 200
    assert denied.status.status_code is StatusCode.ERROR and attrs(denied)["error.type"] == "egress_denied"
    assert [(a["sandforge.status"], v) for a, v in otel.points("sandforge.execs")] == [("ok", 1)]
    no_secret(otel)  # not the credential, the argument, the query, nor the code


def test_a_refused_program_is_an_error_span_that_never_reached_a_sandbox(otel: Otel) -> None:
    policy = default_policy()
    request = ExecutionRequest(code=f"import os\nreturn os.environ.get({SECRET!r})\n")
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        outcome, _ = execute_program(sb, request, policy=policy)
    assert not outcome.ok
    root = otel.one("sandforge.exec")
    assert root.status.status_code is StatusCode.ERROR and attrs(root)["error.type"] == outcome.error_type
    assert attrs(root)["sandforge.verdict"] in ("recoverable", "terminal")
    assert child_of(otel.one("sandforge.validate"), root)
    assert otel.named("sandforge.execute") == [] and otel.named("sandforge.sandbox") == []
    no_secret(otel)


def test_the_exec_command_is_traced(otel: Otel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_BACKEND", "subprocess")
    program = tmp_path / "p.py"
    program.write_text("raise ValueError(args[0])\n")
    result = CliRunner().invoke(main, ["exec", str(program), "--args", json.dumps([SECRET]), "--json"])
    assert result.exit_code == 1, result.output
    root = otel.one("sandforge.exec")
    assert root.status.status_code is StatusCode.ERROR and attrs(root)["error.type"] == "execution"
    execute = otel.one("sandforge.execute")
    assert child_of(execute, root) and attrs(execute)["sandforge.ok"] is False
    assert [(a["sandforge.status"], a["error.type"]) for a, _ in otel.points("sandforge.execs")] == [
        ("error", "execution")
    ]
    no_secret(otel)  # the exception's message (the argument) stays out


def test_the_awaited_exec_of_the_service_has_the_same_tree(otel: Otel) -> None:
    """``execute_program_async`` (``POST /v1/exec``): planned on a thread (a cold verdict) or on the loop, the
    stages are still children of the run's span."""
    from sandforge.runtime.guardrails import clear_cache

    policy = default_policy()
    clear_cache()  # a cold verdict: planned on a thread, in a copy of the span's context

    async def awaited(code: str) -> Any:
        async with AsyncSandbox(sb) as asb:
            return await execute_program_async(asb, ExecutionRequest(code=code, args=[SECRET]), policy=policy)

    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        outcome, _ = asyncio.run(awaited("return len(args[0])"))
        refused, _ = asyncio.run(awaited("import os\nreturn os.getpid()"))
    assert outcome.ok and outcome.value == len(SECRET) and not refused.ok
    ok_run, refused_run = [s for s in otel.spans() if s.name == "sandforge.exec"]
    assert attrs(ok_run)["sandforge.status"] == "ok" and refused_run.status.status_code is StatusCode.ERROR
    validates = otel.named("sandforge.validate")
    assert [child_of(v, ok_run) for v in validates] == [True, False]
    assert child_of(validates[1], refused_run)
    execute = otel.one("sandforge.execute")
    assert child_of(execute, ok_run) and child_of(otel.one("sandforge.sandbox.acquire"), execute)
    no_secret(otel)


def test_a_declared_environment_is_a_child_span_built_then_cached(otel: Otel, tmp_path: Path) -> None:
    import dataclasses

    from sandforge.runtime.agent.environment import Environments
    from sandforge.runtime.environments.builder import EnvironmentStore
    from tests.environments.helpers import offline_policy, require_wheelhouse

    policy = dataclasses.replace(default_policy(), dependencies=offline_policy(require_wheelhouse()))
    code = '# /// script\n# dependencies = ["python-dateutil>=2.8"]\n# ///\nfrom dateutil import parser\n' \
        "return parser.parse(args[0]).year\n"  # fmt: skip
    request = ExecutionRequest(code=code, args=["5 March 2024"])
    environments = Environments(tmp_path / "environments")
    broken = Environments(tmp_path / "e", store=EnvironmentStore(tmp_path / "e", uv=str(tmp_path / "no-uv")))
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        first, _ = execute_program(sb, request, policy=policy, environments=environments)
        again, _ = execute_program(sb, request, policy=policy, environments=environments)
        failed, _ = execute_program(sb, request, policy=policy, environments=broken)
    assert first.ok and again.ok and first.value == 2024 and not failed.ok
    runs = [s for s in otel.spans() if s.name == "sandforge.exec"]
    envs = otel.named("sandforge.environment")
    assert len(runs) == len(envs) == 3 and all(child_of(e, r) for e, r in zip(envs, runs, strict=True))
    assert [attrs(e)["sandforge.environment.cache_hit"] for e in envs[:2]] == [False, True]
    assert (
        attrs(envs[0])["sandforge.environment.id"]
        == first.metadata["env_id"]
        == attrs(runs[0])["sandforge.environment.id"]
    )
    assert envs[2].status.status_code is StatusCode.ERROR
    assert attrs(runs[2])["error.type"] == "dependency_install_failed"
    assert len(otel.named("sandforge.execute")) == 2  # the failed one never reached a sandbox
