"""The host compiles a program once per text (with the runner's own compile_checked, shared with
validation) and ships the code object; the runner uses it only when it was compiled for its own bytecode,
and otherwise compiles the program itself, with the same result."""

from __future__ import annotations

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.inside import compilation, guards, world


def test_the_shipped_code_is_the_checked_compilation() -> None:
    code = "class A:\n    def __init__(self):\n        self.x = 2\nreturn A().x * args[0]"
    shipped = compilation.host_compiled(code)
    assert shipped is not None and shipped["magic"] == compilation.CODE_MAGIC
    compiled = compilation.shipped_code({"compiled": shipped})
    assert compiled is not None and compiled.co_filename == world.TOOL_FILENAME
    namespace = guards.build_globals(world.build_module_proxies(), world.BoundedText(1000), None)  # type: ignore[arg-type]
    exec(compiled, namespace)
    assert namespace[world.TOOL_FUNCTION]({}, [3], {}) == 6


def test_a_refused_program_is_not_shipped() -> None:
    assert compilation.host_compiled("return ().__class__") is None


def test_other_bytecode_or_garbage_is_ignored() -> None:
    shipped = compilation.host_compiled("return 1")
    assert shipped is not None
    assert compilation.shipped_code({"compiled": {**shipped, "magic": "00000000"}}) is None
    assert compilation.shipped_code({"compiled": {**shipped, "marshal": "not base64!"}}) is None
    assert compilation.shipped_code({"compiled": {"magic": compilation.CODE_MAGIC, "marshal": "aGVsbG8="}}) is None
    assert compilation.shipped_code({"compiled": "x"}) is None


def test_a_program_runs_the_same_with_and_without_shipped_code() -> None:
    code = "total: int = 0\nfor v in args:\n    total += v\nreturn total"
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=0)) as sb:
        shipped = sb.execute(ExecutionRequest(code=code, args=[1, 2]))
        compilation._HOST_CODE.clear()
        original = compilation.host_compiled
        compilation.host_compiled = lambda _code: None  # type: ignore[assignment]
        try:
            import sandforge.sandbox.exchange as exchange

            exchange.host_compiled = compilation.host_compiled  # type: ignore[attr-defined]
            compiled_inside = sb.execute(ExecutionRequest(code=code, args=[1, 2]))
        finally:
            compilation.host_compiled = original  # type: ignore[assignment]
            exchange.host_compiled = original  # type: ignore[attr-defined]
    assert shipped.ok and compiled_inside.ok and shipped.value == compiled_inside.value == 3
