"""`sandforge exec` and `sandforge doctor` as a user runs them: exit codes, --commit, --json, typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig

COUNTER = "context['n'] = context.get('n', 0) + args[0]\nreturn context['n']\n"
POLLUTE_THEN_RAISE = "context['n'] = 999\ncontext['junk'] = True\nraise RuntimeError('after writing context')\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_commit_on_success_writes_the_new_context(tmp_path: Path, sandbox_backend: str) -> None:
    program = write(tmp_path, "counter.py", COUNTER)
    ctx = write(tmp_path, "ctx.json", '{"n": 1}')
    code, out, err = invoke("exec", str(program), "--backend", sandbox_backend, "--context", str(ctx),
                            "--args", "[4]", "--commit")  # fmt: skip
    assert code == 0, err
    assert "ok: 5" in out
    assert json.loads(ctx.read_text()) == {"n": 5}


def test_failed_execution_leaves_the_context_file_untouched(tmp_path: Path, sandbox_backend: str) -> None:
    program = write(tmp_path, "bad.py", POLLUTE_THEN_RAISE)
    ctx = write(tmp_path, "ctx.json", '{"n": 1, "keep": "exactly this"}\n')
    before = ctx.read_bytes()
    code, _, err = invoke("exec", str(program), "--backend", sandbox_backend, "--context", str(ctx), "--commit")
    assert code == 1
    assert "execution" in err and "RuntimeError" in err
    assert ctx.read_bytes() == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".ctx.json")]
    assert leftovers == [".ctx.json.lock"]  # no temp file left; the commit lock stays (see docs/security.md)


def test_rejected_program_never_runs_and_commits_nothing(tmp_path: Path) -> None:
    program = write(tmp_path, "escape.py", "import os\ncontext['n'] = 0\nreturn os.getcwd()\n")
    ctx = write(tmp_path, "ctx.json", '{"n": 1}')
    code, out, _ = invoke("exec", str(program), "--context", str(ctx), "--commit", "--json")
    payload = json.loads(out)
    assert code == {"recoverable": 3, "terminal": 4}[payload["metadata"]["verdict"]]  # rejected by the policy
    assert payload["error_type"] == "guardrail_violation"
    assert payload["metadata"]["violations"][0]["location"]["line"] == 1
    assert payload["metadata"]["backend"] == ""  # nothing was executed
    assert json.loads(ctx.read_text()) == {"n": 1}


def test_syntax_error_is_invalid_code(tmp_path: Path) -> None:
    program = write(tmp_path, "broken.py", "def f(:\n")
    code, out, _ = invoke("exec", str(program), "--json")
    assert code == 3 and json.loads(out)["error_type"] == "invalid_code"  # refused, a corrected program may pass


@pytest.mark.parametrize(
    ("manifest", "kind"),
    [
        ('["not-in-the-allow-list==1.0"]', "dependency_policy_violation"),
        ('["six==1", "six==2"]', "invalid_dependency_manifest"),
    ],
)
def test_a_refused_dependency_is_a_policy_refusal(tmp_path: Path, manifest: str, kind: str) -> None:
    """A manifest the policy refuses exits 3 like any refused program (a corrected one may pass), and the
    violation, which is no line's, is printed without a line number."""
    program = write(tmp_path, "deps.py", f"# /// script\n# dependencies = {manifest}\n# ///\nreturn 1\n")
    code, out, _ = invoke("exec", str(program), "--json")
    payload = json.loads(out)
    assert code == 3 and payload["error_type"] == kind and payload["metadata"]["verdict"] == "recoverable"
    code, _, err = invoke("exec", str(program))
    assert code == 3 and f"error [{kind}]" in err and "fix:" in err
    assert "line None" not in err and f"\n  {kind} (recoverable): " in err


def test_json_output_shape(tmp_path: Path) -> None:
    program = write(tmp_path, "p.py", "print('hello')\nreturn {'a': [1, 2]}\n")
    code, out, _ = invoke("exec", str(program), "--json", "--kwargs", '{"x": 1}')
    payload = json.loads(out)
    assert code == 0
    assert set(payload) == {"status", "value", "context", "error_type", "error_message", "retriable", "stdout",
                            "stderr", "metadata", "security_event", "files"}  # fmt: skip
    assert payload["status"] == "ok" and payload["value"] == {"a": [1, 2]} and payload["stdout"] == "hello\n"
    assert payload["metadata"]["usage"]["source"] in ("host", "sandbox")
    assert "policy_fingerprint" in payload["metadata"]


def test_timeout_flag_gives_a_typed_retriable_error(tmp_path: Path) -> None:
    program = write(tmp_path, "loop.py", "while True:\n    pass\n")
    code, out, _ = invoke("exec", str(program), "--timeout", "1", "--json")
    payload = json.loads(out)
    assert code == 5 and payload["error_type"] == "timeout" and payload["retriable"] is True  # a limit: exit 5


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--args", "[1,"], "--args is not valid JSON"),
        (["--args", '{"a": 1}'], "--args must be a JSON array"),
        (["--kwargs", "[1]"], "--kwargs must be a JSON object"),
        (["--commit"], "--commit needs --context"),
        (["--timeout", "-1"], "invalid --timeout"),  # the flag the user typed, not the field
        (["--memory", "1"], "invalid --memory"),
    ],
)
def test_usage_errors_exit_2_without_traceback(tmp_path: Path, extra: list[str], needle: str) -> None:
    program = write(tmp_path, "p.py", "return 1\n")
    code, out, err = invoke("exec", str(program), *extra)
    assert code == 2, (out, err)
    assert needle in err
    assert "Traceback" not in out + err


def test_malformed_context_file_is_a_usage_error(tmp_path: Path) -> None:
    program = write(tmp_path, "p.py", "return 1\n")
    for text, needle in (('{"n": ', "not valid JSON"), ("[1, 2]", "must be a JSON object")):
        ctx = write(tmp_path, "ctx.json", text)
        code, _, err = invoke("exec", str(program), "--context", str(ctx), "--commit")
        assert code == 2 and needle in err
        assert ctx.read_text() == text


def test_missing_program_file_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = invoke("exec", str(tmp_path / "nope.py"))
    assert code == 2 and "cannot read" in err


def test_oversized_request_is_invalid_request() -> None:
    limits = Limits(max_message_bytes=64 * 1024)
    with Sandbox(SandboxConfig(pool_size=0)) as sb:
        out = sb.execute(ExecutionRequest(code="return len(context['blob'])", context={"blob": "x" * 100_000},
                                          limits=limits))  # fmt: skip
    assert out.error_type == "invalid_request"
    assert "exceeds" in (out.error_message or "")


def test_engine_down_is_sandbox_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with Sandbox(SandboxConfig.from_env(pool_size=0, backend="docker")) as sb:
        out = sb.execute(ExecutionRequest(code="return 1"))
    assert out.error_type == "sandbox_unavailable" and out.retriable


def test_doctor_reports_subprocess_protections() -> None:
    code, out, err = invoke("doctor", "--backend", "subprocess", "--json")
    assert code == 0, err
    report = json.loads(out)["backends"][0]
    assert report["backend"] == "subprocess" and report["works"] is True
    assert set(report["required"]) <= {k for k, v in report["protections"].items() if v}
