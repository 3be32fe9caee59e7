"""The host compiles a program once per text (with the runner's own compile_checked, shared with
validation) and ships the code object; the runner uses it only when it was compiled for its own bytecode,
and otherwise compiles the program itself, with the same result."""

from __future__ import annotations

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig, runner


def test_the_shipped_code_is_the_checked_compilation() -> None:
    code = "class A:\n    def __init__(self):\n        self.x = 2\nreturn A().x * args[0]"
    shipped = runner.host_compiled(code)
    assert shipped is not None and shipped["magic"] == runner.CODE_MAGIC
    compiled = runner.shipped_code({"compiled": shipped})
    assert compiled is not None and compiled.co_filename == runner.TOOL_FILENAME
    namespace = runner.build_globals(runner.build_module_proxies(), runner.BoundedText(1000), None)  # type: ignore[arg-type]
    exec(compiled, namespace)
    assert namespace[runner.TOOL_FUNCTION]({}, [3], {}) == 6


def test_a_refused_program_is_not_shipped() -> None:
    assert runner.host_compiled("return ().__class__") is None


def test_other_bytecode_or_garbage_is_ignored() -> None:
    shipped = runner.host_compiled("return 1")
    assert shipped is not None
    assert runner.shipped_code({"compiled": {**shipped, "magic": "00000000"}}) is None
    assert runner.shipped_code({"compiled": {**shipped, "marshal": "not base64!"}}) is None
    assert runner.shipped_code({"compiled": {"magic": runner.CODE_MAGIC, "marshal": "aGVsbG8="}}) is None
    assert runner.shipped_code({"compiled": "x"}) is None


def test_a_program_runs_the_same_with_and_without_shipped_code() -> None:
    code = "total: int = 0\nfor v in args:\n    total += v\nreturn total"
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        shipped = sb.execute(ExecutionRequest(code=code, args=[1, 2]))
        runner._HOST_CODE.clear()
        original = runner.host_compiled
        runner.host_compiled = lambda _code: None  # type: ignore[assignment]
        try:
            import sandforge.sandbox.exchange as exchange

            exchange.host_compiled = runner.host_compiled  # type: ignore[attr-defined]
            compiled_inside = sb.execute(ExecutionRequest(code=code, args=[1, 2]))
        finally:
            runner.host_compiled = original  # type: ignore[assignment]
            exchange.host_compiled = original  # type: ignore[attr-defined]
    assert shipped.ok and compiled_inside.ok and shipped.value == compiled_inside.value == 3
