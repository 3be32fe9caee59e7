"""The restricted language: what programs may write, compiled under RestrictedPython at close to C speed.

``compile_checked`` is the one compiler: the host's validation calls it (``runtime.guardrails.engine``) and
ships its code object to the sandbox (``host_compiled``, ``shipped_code``), so what the policy approves is
exactly what runs.
"""

from __future__ import annotations

import ast
import base64
import marshal
import threading
import types
import warnings
from importlib.util import MAGIC_NUMBER
from typing import Any

from .lowering import LowerForRestriction
from .wire import CompiledProgram
from .wire import error as _error
from .world import TOOL_FILENAME, TOOL_FUNCTION

#: them implicitly and acts on their results by name (copy's reduce protocol sets attributes named by the
#: state it returns), or they run at moments the runner does not control (``__del__``, class creation hooks).
NEVER_DEFINED = frozenset({
    "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__", "__getnewargs_ex__",
    "__copy__", "__deepcopy__", "__getattribute__", "__del__", "__class_getitem__", "__init_subclass__",
    "__set_name__", "__mro_entries__", "__prepare__", "__instancecheck__", "__subclasscheck__",
    "__subclasshook__", "__fspath__",
})  # fmt: skip


#: Fields of a statement that hold statements (annotations and definitions live only in statements).
_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_BODIES: dict[type, tuple[str, ...]] = {}


def string_in_annotation(annotation: ast.expr | None) -> ast.AST | None:
    """The first string (or f-string) in an annotation that type-hint helpers would evaluate: not the values
    of ``Literal[...]`` nor the metadata of ``Annotated[type, ...]``, which they keep as data. Names,
    attributes, subscripts, unions and tuples (nearly every annotation) take the fast paths. The runner
    keeps string annotations as strings (issue 38); the policy plugin ``string_annotation`` uses this for
    a deployment that still wants them refused."""
    stack: list[ast.AST] = [] if annotation is None else [annotation]
    while stack:
        part = stack.pop()
        kind = type(part)
        if kind is ast.Name:
            continue
        if kind is ast.Constant:
            if isinstance(part.value, (str, bytes)):  # type: ignore[attr-defined]
                return part
            continue
        if kind is ast.JoinedStr:
            return part
        if kind is ast.Attribute:
            stack.append(part.value)  # type: ignore[attr-defined]
        elif kind is ast.Subscript:
            head, index = part.value, part.slice  # type: ignore[attr-defined]
            name = head.id if type(head) is ast.Name else head.attr if type(head) is ast.Attribute else ""
            stack.append(head)
            if name == "Literal":
                continue
            if name == "Annotated" and type(index) is ast.Tuple and index.elts:
                stack.append(index.elts[0])
                continue
            stack.append(index)
        elif kind is ast.BinOp:
            stack.extend((part.left, part.right))  # type: ignore[attr-defined]
        elif kind is ast.Tuple or kind is ast.List:
            stack.extend(part.elts)  # type: ignore[attr-defined]
        else:
            stack.extend(ast.iter_child_nodes(part))
    return None


def inner_wall_refusal(tree: ast.Module) -> tuple[str, int | None] | None:
    """Why the parsed program may not run (message, line), or None: a definition of a ``NEVER_DEFINED``
    special method, which the compiler does not refuse.

    String annotations are not refused (issue 38): function annotations are removed before compilation and
    class-body ones stay strings that nothing the program can reach evaluates (``typing.get_type_hints``,
    ``ForwardRef``, ``functools.singledispatch`` are withheld). Definitions only occur in statements, so
    only statements are walked (iteratively): a few percent of a program's nodes.
    """
    stack: list[Any] = list(tree.body)
    while stack:
        node = stack.pop()
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name):
                name = node.target.id
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in NEVER_DEFINED:
                    name = target.id
        if name in NEVER_DEFINED:
            message = f"defining {name} is not allowed in the sandbox: the standard library calls it implicitly"
            return message, getattr(node, "lineno", None)
        fields = _BODIES.get(type(node))
        if fields is None:
            fields = _BODIES[type(node)] = tuple(f for f in _BODY_FIELDS if f in type(node)._fields)
        for field in fields:
            stack.extend(getattr(node, field))
    return None


_POLICY: Any = None


def _policy_class() -> Any:
    """The RestrictedPython transformer sandforge compiles with (``restricting.py``), imported on first use:
    in a container RestrictedPython becomes importable only once the boot frame gives its path."""
    global _POLICY
    if _POLICY is None:
        from .restricting import SandforgePolicy

        _POLICY = SandforgePolicy
    return _POLICY


def _compile_restricted(tree: ast.Module) -> types.CodeType:
    """RestrictedPython's checks and rewrites (sandforge's policy), then ``compile`` without inheriting this
    module's ``from __future__ import annotations`` (class-body annotations must be objects, not strings,
    for dataclasses). SyntaxError with the policy's messages when it refuses the program."""
    errors: list[str] = []
    policy = _policy_class()(errors, [], {})
    policy.visit(tree)
    if errors:
        raise SyntaxError(tuple(errors))
    return compile(tree, TOOL_FILENAME, "exec", dont_inherit=True)


#: One refusal of the compiler: (``invalid_code`` or ``sandbox_violation``, line or None, message).
Refusal = tuple[str, int | None, str]


#: CPython 3.11 keeps the AST converters' recursion counter per interpreter, not per thread: two threads turning
#: source into AST objects or a tree into code at once fail with "SystemError: AST constructor recursion depth
#: mismatch" (seen here under load, python/cpython gh-106905). The host parses and compiles programs on many
#: threads (validation, the exchange, the store), so every such conversion holds this one lock (``parse``);
#: inside a sandbox it is never contended.
AST_LOCK = threading.RLock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.Module:
    """``ast.parse`` under :data:`AST_LOCK` (same errors)."""
    with AST_LOCK:
        return ast.parse(source, filename, mode)  # type: ignore[return-value]


#: Host side: programs compiled here (by validation or the exchange), by text, as marshal bytes; the
#: execute frame carries them so the sandbox skips RestrictedPython's compilation (``host_compiled``).
_HOST_CODE: dict[str, bytes] = {}
_HOST_CODE_LOCK = threading.Lock()
HOST_CODE_CACHE = 256
#: What a shipped code object must have been compiled for: this interpreter's bytecode (magic number).
CODE_MAGIC = MAGIC_NUMBER.hex()


def host_compiled(code: str) -> CompiledProgram | None:
    """The execute frame's ``compiled`` field for ``code``: the code object ``compile_checked`` produces,
    compiled once per program text on the host (validation already did it for a validated program) and
    marshalled; None when the program does not compile (the runner then reports why, as always)."""
    with _HOST_CODE_LOCK:
        blob = _HOST_CODE.get(code)
    if blob is None:
        compile_checked(code, remember=True)
        with _HOST_CODE_LOCK:
            blob = _HOST_CODE.get(code)
        if blob is None:
            return None
    return {"magic": CODE_MAGIC, "marshal": base64.b64encode(blob).decode("ascii")}


def _remember(code: str, compiled: types.CodeType) -> None:
    blob = marshal.dumps(compiled)
    with _HOST_CODE_LOCK:
        _HOST_CODE.pop(code, None)
        _HOST_CODE[code] = blob
        while len(_HOST_CODE) > HOST_CODE_CACHE:
            del _HOST_CODE[next(iter(_HOST_CODE))]


def shipped_code(frame: dict[str, Any]) -> types.CodeType | None:
    """The code object the host compiled for this frame's program, if it was compiled for this
    interpreter's bytecode; None otherwise (the runner compiles the program itself). The host is the
    trusted side of the channel: only it writes frames to the runner."""
    shipped = frame.get("compiled")
    if (
        not isinstance(shipped, dict)
        or shipped.get("magic") != CODE_MAGIC
        or not isinstance(shipped.get("marshal"), str)
    ):
        return None
    try:  # host to sandbox only: the host never decodes anything but JSON from a sandbox
        compiled = marshal.loads(base64.b64decode(shipped["marshal"], validate=True))  # noqa: S302
    except (ValueError, TypeError, EOFError):
        return None
    if type(compiled) is not types.CodeType or compiled.co_filename != TOOL_FILENAME:
        return None
    return compiled


def compile_checked(
    code: str, tree: ast.Module | None = None, *, remember: bool = False
) -> tuple[types.CodeType | None, list[Refusal]]:
    """Compile the body as a function under sandforge's RestrictedPython policy: (code, []) or (None, every
    refusal). The host's validation calls this very function (``runtime.guardrails.engine``), so what the
    policy approves is what the sandbox compiles. ``tree``: the program already parsed (it is changed);
    ``remember``: keep the result for ``host_compiled`` (host side)."""
    compiled, refusals = _compile_checked(code, tree)
    if remember and compiled is not None:
        _remember(code, compiled)
    return compiled, refusals


def _compile_checked(code: str, tree: ast.Module | None) -> tuple[types.CodeType | None, list[Refusal]]:
    with AST_LOCK:  # parsing, the rewrites' own small parses and the compile of the tree: one conversion at a time
        return _compile_checked_locked(code, tree)


def _compile_checked_locked(code: str, tree: ast.Module | None) -> tuple[types.CodeType | None, list[Refusal]]:
    if tree is None:
        try:
            tree = ast.parse(code, TOOL_FILENAME, "exec")
        except (SyntaxError, ValueError) as exc:
            message = f"syntax error: {exc.msg if isinstance(exc, SyntaxError) else exc}"
            return None, [("invalid_code", getattr(exc, "lineno", None), message)]
        except (RecursionError, MemoryError):
            return None, [("invalid_code", None, "program is nested too deeply to compile")]
    refusal = inner_wall_refusal(tree)
    if refusal is not None:
        return None, [("sandbox_violation", refusal[1], refusal[0])]
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=n) for n in ("context", "args", "kwargs")], vararg=None,
        kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[],
    )  # fmt: skip
    at = {"lineno": 1, "col_offset": 0, "end_lineno": 1, "end_col_offset": 0}
    for arg in arguments.args:
        ast.copy_location(arg, ast.Pass(**at))
    body = tree.body or [ast.Pass(**at)]
    func = ast.FunctionDef(name=TOOL_FUNCTION, args=arguments, body=body, decorator_list=[], returns=None, **at)  # type: ignore[arg-type]
    try:
        # every node made from here on gets its location where it is made (no walk of the whole tree)
        wrapper = LowerForRestriction().visit(ast.Module(body=[func], type_ignores=[]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # RestrictedPython warns about constructs it then rejects
            return _compile_restricted(wrapper), []
    except SyntaxError as exc:
        if isinstance(exc.args[0], tuple):
            return None, [_refusal(str(m)) for m in exc.args[0]]
        kind = "invalid_code" if "outside function" in str(exc.msg) else "sandbox_violation"
        return None, [(kind, exc.lineno, str(exc.msg))]
    except (RecursionError, MemoryError):
        return None, [("invalid_code", None, "program is nested too deeply to compile")]


def _refusal(text: str) -> Refusal:
    """RestrictedPython's ``Line N: message`` as a refusal."""
    head, sep, rest = text.partition(": ")
    if sep and head.startswith("Line ") and head[5:].isdigit():
        return "sandbox_violation", int(head[5:]), rest
    return "sandbox_violation", None, text


def compile_program(code: str) -> tuple[types.CodeType | None, dict[str, Any] | None]:
    """Compile the body as a function under RestrictedPython; return (code, None) or (None, error)."""
    compiled, refusals = compile_checked(code)
    if not refusals:
        return compiled, None
    kind, line, message = refusals[0]
    if message.startswith("syntax error") or "nested too deeply" in message:
        return None, _error(kind, message, exception="SyntaxError" if line else None, line=line)
    text = "; ".join(f"Line {ln}: {msg}" if ln else msg for _, ln, msg in refusals)
    kind = "invalid_code" if "outside function" in text else "sandbox_violation"
    return None, _error(kind, f"rejected by the sandbox: {text}", exception="SyntaxError", line=line)
