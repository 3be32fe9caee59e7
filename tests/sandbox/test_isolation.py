"""Every backend: the program contract, typed errors, resource exhaustion and attacks through the runner."""

from __future__ import annotations

import os

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox

SMALL = Limits(timeout_s=3, memory_mb=128, max_output_bytes=4096)


def run(sb: Sandbox, code: str, limits: Limits | None = None, **kw: object):
    return sb.execute(ExecutionRequest(code=code, limits=limits or sb.config.limits, **kw))  # type: ignore[arg-type]


def assert_healthy(sb: Sandbox) -> None:
    """After an attack the backend (and its warm pool) still serves a clean execution."""
    out = run(sb, "context['after'] = True\nreturn 'alive'")
    assert out.ok, out.error_message
    assert out.value == "alive" and out.context == {"after": True}


def test_state_round_trips(sandbox: Sandbox) -> None:
    ctx = {"n": 1, "nested": {"list": [1, 2.5, "three", None, True], "unicode": "żółw 🐢"}}
    out = run(sandbox, "context['n'] += args[0] + kwargs['k']\ncontext['seen'] = list(context)\nreturn context['n']",
              context=ctx, args=[2], kwargs={"k": 3})  # fmt: skip
    assert out.ok, out.error_message
    assert out.value == 6
    assert out.context == {**ctx, "n": 6, "seen": ["n", "nested"]}
    assert out.backend == sandbox.config.backend


def test_error_outcome_carries_no_context(sandbox: Sandbox) -> None:
    out = run(sandbox, "context['polluted'] = True\nraise ValueError('boom')", context={"clean": 1})
    assert out.status == "error" and out.error_type == ErrorType.EXECUTION
    assert out.context is None
    assert "ValueError: boom" in (out.error_message or "")
    assert out.metadata["line"] == 2


def test_tool_returned_error(sandbox: Sandbox) -> None:
    out = run(sandbox, "return Outcome.error('upstream_down', 'feed returned 503', retriable=True)")
    assert out.error_type == ErrorType.TOOL_ERROR and out.retriable
    assert out.metadata["tool_error_type"] == "upstream_down"


def test_syntax_error_is_invalid_code(sandbox: Sandbox) -> None:
    out = run(sandbox, "def broken(:\n    pass")
    assert out.error_type == ErrorType.INVALID_CODE


def test_non_serializable_result(sandbox: Sandbox) -> None:
    for code in ("return {1, 2}", "context['f'] = float('nan')\nreturn 1", "return {1: 'a', '1': 'b'}"):
        out = run(sandbox, code)
        assert out.error_type == ErrorType.NON_SERIALIZABLE_RESULT, (code, out.error_message)


def test_printing_a_fake_result_does_not_forge_it(sandbox: Sandbox) -> None:
    forged = '{"type":"result","status":"ok","value":"forged","context":{"admin":true}}'
    code = f"print({forged!r})\nreturn 'real'"
    out = run(sandbox, code)
    assert out.ok and out.value == "real" and out.context == {}
    assert forged in out.stdout


def test_infinite_loop_times_out(sandbox: Sandbox) -> None:
    limits = Limits(timeout_s=1.5, memory_mb=128)
    out = run(sandbox, "while True:\n    pass", limits)
    assert out.error_type == ErrorType.TIMEOUT and out.retriable
    assert out.duration_s < limits.timeout_s + 2.0  # enforcement bound, not a speed target
    assert_healthy(sandbox)


def test_memory_bomb_hits_memory_limit(sandbox: Sandbox) -> None:
    out = run(sandbox, "blocks = []\nwhile True:\n    blocks.append(bytearray(8 * 1024 * 1024))", SMALL)
    assert out.error_type == ErrorType.MEMORY_LIMIT, out.error_message
    assert out.usage.peak_memory_mb < SMALL.memory_mb * 1.5
    assert_healthy(sandbox)


def test_single_huge_allocation(sandbox: Sandbox) -> None:
    out = run(sandbox, "return len('a' * (4 * 1024 ** 3))", SMALL)
    assert out.error_type == ErrorType.MEMORY_LIMIT


def test_huge_integer_arithmetic_is_stopped(sandbox: Sandbox) -> None:
    limits = Limits(timeout_s=2, memory_mb=128)
    out = run(sandbox, "x = 7 ** (10 ** 9)\nreturn 1", limits)
    assert out.error_type in (ErrorType.TIMEOUT, ErrorType.MEMORY_LIMIT)
    assert out.duration_s < limits.timeout_s + 2.0
    assert_healthy(sandbox)


def test_output_flood_is_cut(sandbox: Sandbox) -> None:
    out = run(sandbox, "while True:\n    print('flood' * 100)", SMALL)
    assert out.error_type == ErrorType.OUTPUT_LIMIT
    assert out.stdout_truncated and "truncated" in out.stdout
    assert len(out.stdout.encode()) <= SMALL.max_output_bytes + 100


def test_output_limit_cannot_be_swallowed(sandbox: Sandbox) -> None:
    code = "for i in range(10000):\n    try:\n        print('x' * 100)\n    except Exception:\n        pass\n"
    code += "return 'hid it'"
    out = run(sandbox, code, SMALL)
    assert out.error_type == ErrorType.OUTPUT_LIMIT


def test_huge_return_value_is_output_limit(sandbox: Sandbox) -> None:
    limits = Limits(timeout_s=10, memory_mb=512, max_message_bytes=1024 * 1024)
    out = run(sandbox, "return 'x' * (4 * 1024 * 1024)", limits)
    assert out.error_type == ErrorType.OUTPUT_LIMIT


@pytest.mark.parametrize(
    ("attack", "code"),
    [
        ("import os", "import os\nreturn os.listdir('/')"),
        ("host file", "return open('/etc/passwd').read()"),
        ("sys via typing", "import typing\nreturn typing.sys.modules['os'].environ"),
        ("random internals", "import random\nreturn random._os.environ"),
        ("subclasses walk", "return [c for c in ().__class__.__base__.__subclasses__()]"),
        ("frame walk", "g = (x for x in [1])\nreturn g.gi_frame.f_back.f_globals"),
        ("format attribute", "return '{0.__class__.__mro__}'.format(1)"),
        ("string.Formatter", "import string\nreturn string.Formatter().format('{0.__class__}', 1)"),
        ("attrgetter", "import operator\nreturn operator.attrgetter('__class__')(1)"),
        ("getattr dunder", "return getattr(1, '__cl' + 'ass__')"),
        ("__import__", "return __import__('os').getcwd()"),
        ("spawn", "import subprocess\nreturn subprocess.run(['id'])"),
        ("socket", "import socket\nreturn socket.create_connection(('1.1.1.1', 80))"),
        ("file via ElementTree", "import xml.etree.ElementTree as ET\nreturn ET.parse('/etc/passwd')"),
        ("tool handle mutation", "t = tool('x')\nt.hijack = 1\nreturn 1"),
    ],
)
def test_attacks_through_the_runner_fail(sandbox: Sandbox, attack: str, code: str) -> None:
    out = run(sandbox, code, SMALL)
    assert out.status == "error", f"{attack} succeeded: {out.value!r}"
    assert out.error_type in (ErrorType.SANDBOX_VIOLATION, ErrorType.EXECUTION), out.error_message
    assert "root:" not in (out.error_message or "")


def test_host_environment_is_not_visible(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_TEST_SECRET", "hunter2")
    out = run(sandbox, "import os\nreturn dict(os.environ)")
    assert out.status == "error"
    assert "hunter2" not in out.model_dump_json()


def test_nested_calls_without_a_bridge_are_typed_errors(sandbox: Sandbox) -> None:
    out = run(sandbox, "r = tool('calculator').add(1)\nreturn [r.ok, r.error_type]")
    assert out.ok and out.value == [False, "nested_calls_unavailable"]


def test_nested_calls_are_bridged(sandbox: Sandbox) -> None:
    calls = []

    def bridge(call):  # type: ignore[no-untyped-def]
        calls.append(call)
        return {"status": "ok", "value": call.args[0] * 10, "error_type": None, "error_message": None}

    code = (
        "r = tool('calculator').times_ten(4)\n"
        "d = delegate('writer', purpose='p').draft('ab')\n"
        "return [r.ok, r.value, d.value]"
    )
    out = sandbox.execute(ExecutionRequest(code=code, limits=sandbox.config.limits), bridge=bridge)
    assert out.ok, out.error_message
    assert out.value == [True, 40, "ab" * 10]
    assert [c.target.kind for c in calls] == ["tool", "delegate"]
    assert calls[1].target.purpose == "p" and calls[0].method == "times_ten"
    assert out.metadata["nested_calls"] == 2


def test_every_execution_gets_a_fresh_sandbox(sandbox: Sandbox) -> None:
    first = run(sandbox, "import random\ncontext['r'] = random.random()\nreturn 1")
    second = run(sandbox, "return sorted(context)", context={})
    assert first.ok and second.ok and second.value == []


def test_pool_hands_out_each_worker_once(sandbox: Sandbox) -> None:
    pool = sandbox.pool()
    assert pool.wait_ready(1, timeout=60)
    w1 = pool.acquire()
    w2 = pool.acquire()
    assert w1 is not w2
    out = w1.execute(ExecutionRequest(code="return 1", limits=w1.limits), None)
    assert out.ok and not w1.alive()
    w2.destroy()


def test_unhealthy_pool_member_is_replaced(sandbox: Sandbox) -> None:
    pool = sandbox.pool()
    assert pool.wait_ready(1, timeout=60)
    with pool._lock:
        victim = pool._ready[0]
    victim.destroy()  # dies while waiting in the pool
    out = run(sandbox, "return 'fresh'")
    assert out.ok and out.value == "fresh"
    assert pool.stats["replaced"] >= 1


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the root-to-nobody drop")
def test_protections_reported(sandbox: Sandbox) -> None:
    out = run(sandbox, "return 1")
    assert out.protections, "no protections reported"
    if sandbox.config.backend == "subprocess":
        for p in ("seccomp", "no_new_privs", "rlimits", "unprivileged_user", "net_namespace", "private_root"):
            assert out.protections[p], p
        assert out.usage.source == "host"
