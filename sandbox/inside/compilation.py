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

from .wire import CompiledProgram
from .wire import error as _error
from .world import PROGRAM_MODULE, TOOL_FILENAME, TOOL_FUNCTION, _words

#: them implicitly and acts on their results by name (copy's reduce protocol sets attributes named by the
#: state it returns), or they run at moments the runner does not control (``__del__``, class creation hooks).
NEVER_DEFINED = frozenset({
    "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__", "__getnewargs_ex__",
    "__copy__", "__deepcopy__", "__getattribute__", "__del__", "__class_getitem__", "__init_subclass__",
    "__set_name__", "__mro_entries__", "__prepare__", "__instancecheck__", "__subclasscheck__",
    "__subclasshook__", "__fspath__",
})  # fmt: skip


_STRING_ANNOTATION = (
    "String annotations are not allowed: type-hint helpers evaluate them as code, outside the sandbox's "
    'compiler; write the annotation as an expression (x: Node, not x: "Node") or drop it'
)
#: Fields of a statement that hold statements (annotations and definitions live only in statements).
_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_BODIES: dict[type, tuple[str, ...]] = {}


def string_in_annotation(annotation: ast.expr | None) -> ast.AST | None:
    """The first string (or f-string) in an annotation that type-hint helpers would evaluate: not the values
    of ``Literal[...]`` nor the metadata of ``Annotated[type, ...]``, which they keep as data. Names,
    attributes, subscripts, unions and tuples (nearly every annotation) take the fast paths."""
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
    """Why the parsed program may not run (message, line), or None. Two refusals the compiler does not make:

    - a string anywhere in an annotation: annotations are never evaluated in the sandbox, but a string one is
      code that the standard library's type-hint helpers evaluate with ``eval()`` outside the restricted
      compiler (how ``functools.singledispatch`` reached ``os``); write the annotation as an expression;
    - a definition of a ``NEVER_DEFINED`` special method.

    Annotations and definitions only occur in statements, so only statements are walked (iteratively): a
    few percent of a program's nodes.
    """
    stack: list[Any] = list(tree.body)
    while stack:
        node = stack.pop()
        annotations: list[ast.expr | None] = []
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations.extend(a.annotation for a in every if a is not None)
            annotations.append(node.returns)
            name = node.name
        elif isinstance(node, ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
            if isinstance(node.target, ast.Name):
                name = node.target.id
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in NEVER_DEFINED:
                    name = target.id
        for annotation in annotations:
            part = string_in_annotation(annotation)
            if part is not None:
                return _STRING_ANNOTATION, getattr(part, "lineno", None)
        if name in NEVER_DEFINED:
            message = f"defining {name} is not allowed in the sandbox: the standard library calls it implicitly"
            return message, getattr(node, "lineno", None)
        fields = _BODIES.get(type(node))
        if fields is None:
            fields = _BODIES[type(node)] = tuple(f for f in _BODY_FIELDS if f in type(node)._fields)
        for field in fields:
            stack.extend(getattr(node, field))
    return None


#: Special methods a program's own class may define (``def __eq__(self, other)`` in a class body).
#: Not here: what changes attribute lookup for everybody (``__getattribute__``), what runs at unpredictable
#: times (``__del__``), and hooks on class creation or pickling (``__init_subclass__``, ``__set_name__``,
#: ``__class_getitem__``, descriptors, ``__reduce__``...).
SPECIAL_METHODS: frozenset[str] = frozenset(
    f"__{name}__"
    for name in [
        *_words(
            "init post_init new repr str format bytes hash bool len length_hint iter next reversed contains "
            "getitem setitem delitem missing eq ne lt le gt ge call enter exit getattr setattr delattr "
            "neg pos abs invert round floor ceil trunc int float complex index copy deepcopy"
        ),
        *(
            f"{prefix}{op}"
            for op in _words("add sub mul truediv floordiv mod divmod pow matmul lshift rshift and or xor")
            for prefix in ("", "r", "i")
        ),
    ]
)
#: Special methods ``super().__x__(...)`` (or ``super(C, self).__x__``) may call: a program's own special
#: method extending its base's. Not the attribute protocol (``super().__setattr__`` writes any name).
SUPER_METHODS: frozenset[str] = SPECIAL_METHODS - {"__getattr__", "__setattr__", "__delattr__", "__new__"}
#: Attribute reads that stay a guard call: ``str.format`` and ``string.Formatter``'s field access.
GUARDED_READS: frozenset[str] = frozenset({"format", "format_map", "get_field", "get_value", "vformat"})
#: Names RestrictedPython's generated code uses (besides ``_x_`` names): never program-local.
RESERVED_NAMES: frozenset[str] = frozenset({"_print", "_print_", "printed"})

#: More modules that cannot reach the system (issue 15), each audited; merged into ALLOWED_MODULES.


_BINDING_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _binds(function: ast.FunctionDef, name: str) -> bool:
    """Whether anything in ``function`` (nested scopes included, to be safe) could rebind or delete
    ``name``: an assignment, ``del``, a loop/with/except/import/match target, a nested definition or
    parameter of that name, or a ``global``/``nonlocal`` declaration of it."""
    for node in ast.walk(ast.Module(body=function.body, type_ignores=[])):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, _BINDING_NODES) and node.name == name:
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name).split(".")[0] == name:
            return True
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
            return True
        if isinstance(node, ast.MatchMapping) and node.rest == name:
            return True
    return False


class LowerForRestriction(ast.NodeTransformer):
    """The AST pass before RestrictedPython's: what it would refuse or guard slowly, said in plain Python.

    - ``x.a += v`` becomes ``t = x; u = t.a; u += v; t.a = u`` (each part evaluated once, in-place
      semantics kept; the write goes through ``_write_``). Names and items stay native augmented assignments.
    - Annotations are never evaluated: removed from function signatures and from assignments outside class
      bodies (``total: float = 0.0`` is ``total = 0.0``). In class bodies they stay (dataclasses, NamedTuple
      and TypedDict read them) and are checked like any expression, and string annotations are refused.
    - A ``def`` directly in a class body is marked as a method (special method names are allowed there).
    """

    def __init__(self) -> None:
        self.counter = 0
        self.in_class: list[bool] = [False]
        self.selfs: list[str | None] = [None]  # the current method's never-rebound first parameter

    def generic_visit(self, node: ast.AST) -> ast.AST:
        """Only statement lists are walked: everything this pass rewrites (definitions, annotated and
        augmented assignments) is a statement, and no expression contains a statement (a lambda has no
        annotations), so expressions are never descended into: the pass costs a visit per statement."""
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._statements(value))
        for handler in getattr(node, "handlers", None) or ():
            handler.body = self._statements(handler.body)
        for case in getattr(node, "cases", None) or ():
            case.body = self._statements(case.body)
        return node

    def _temp(self, value: ast.expr, node: ast.AST) -> tuple[ast.Assign, str]:
        self.counter += 1
        name = f"sandforge_aug_{self.counter}"
        assign = ast.copy_location(ast.Assign(targets=[ast.Name(name, ast.Store())], value=value), node)
        return ast.fix_missing_locations(assign), name

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        for child in node.body:
            if isinstance(child, ast.FunctionDef):
                child.sandforge_method = True  # type: ignore[attr-defined]
                first = (child.args.posonlyargs + child.args.args)[:1]
                if first and not _binds(child, first[0].arg):
                    child.sandforge_self = first[0].arg  # type: ignore[attr-defined]
        self.in_class.append(True)
        try:
            self.generic_visit(node)
        finally:
            self.in_class.pop()
        return node

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Any:
        self.selfs.append(getattr(node, "sandforge_self", None))
        try:
            return self._function_body(node)
        finally:
            self.selfs.pop()

    def _function_body(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Any:
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                arg.annotation = None
        if isinstance(node, ast.Lambda):
            return node  # an expression: no statements, no annotations
        node.returns = None
        self.in_class.append(False)
        try:
            node.body = self._statements(node.body)
        finally:
            self.in_class.pop()
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            result = self.visit(stmt)
            if result is None:
                continue
            out.extend(result if isinstance(result, list) else [result])
        return out or [ast.Pass()]

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        if self.in_class[-1] and isinstance(node.target, ast.Name):
            return node  # evaluated into the class's __annotations__; RestrictedPython checks it
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if not isinstance(target, ast.Attribute):
            return node
        prelude: list[ast.stmt] = []
        if isinstance(target.value, ast.Name) and target.value.id == self.selfs[-1]:
            obj = target.value.id  # a method's own never-rebound ``self``: evaluating it twice is the same
        else:
            bind_obj, obj = self._temp(target.value, node)
            prelude.append(bind_obj)
        bind_val, val = self._temp(ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Load()), node)
        update = ast.AugAssign(target=ast.Name(val, ast.Store()), op=node.op, value=node.value)
        store = ast.Assign(
            targets=[ast.Attribute(ast.Name(obj, ast.Load()), target.attr, ast.Store())],
            value=ast.Name(val, ast.Load()),
        )
        fixed = [ast.fix_missing_locations(ast.copy_location(stmt, node)) for stmt in (update, store)]
        return [*prelude, bind_val, *fixed]


#: The flag a method sets once per call when its first parameter is the program's own object.
OWN_FLAG = "_own_self_"


class _OwnWrites(ast.NodeTransformer):
    """In one method's body (not nested scopes), ``_write_(self)`` becomes
    ``(self if _own_self_ else _write_(self))``: a native store for the program's own objects, the guard
    for anything else (a method called on a foreign object: ``Class.method(library_object)``)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.changed = False

    def rewrite(self, function: ast.FunctionDef) -> bool:
        function.body = [self.visit(stmt) for stmt in function.body]
        return self.changed

    def visit_FunctionDef(self, node: ast.AST) -> Any:
        return node  # a nested scope: its ``self`` is a closure variable, guarded as usual

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "_write_" and len(node.args) == 1
                and isinstance(node.args[0], ast.Name) and node.args[0].id == self.owner):  # fmt: skip
            self.changed = True
            native = ast.IfExp(test=ast.Name(OWN_FLAG, ast.Load()), body=ast.Name(self.owner, ast.Load()), orelse=node)
            return ast.fix_missing_locations(ast.copy_location(native, node))
        return node


_POLICY: Any = None


def _policy_class() -> Any:
    """The RestrictedPython transformer sandforge compiles with (built once, after RestrictedPython is
    importable: in a container its path comes with the boot frame)."""
    global _POLICY
    if _POLICY is not None:
        return _POLICY
    from RestrictedPython import transformer as rp

    def is_super_call(node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"

    class SandforgePolicy(rp.RestrictingNodeTransformer):
        """RestrictedPython's static rules, native operations where its guards would check nothing."""

        special_def: str | None = None

        def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
            if name and name[0] == "_" and name != "_" and name == self.special_def:
                return
            if (name and name[0] == "_" and len(name) > 1 and name[1] != "_" and name[-1] != "_"
                    and name not in RESERVED_NAMES and not (name[:4] == "_tmp" and name[4:].isdigit())):  # fmt: skip
                return  # a program-local helper name (``_parse``, ``_CACHE``): never one the runtime uses
            super().check_name(node, name, allow_magic_methods)

        def check_import_names(self, node: ast.Import | ast.ImportFrom) -> Any:
            # no program-local ``_`` names here: ``import _strptime`` and ``from _strptime import x`` stay refused
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in [*modules, *(n for alias in node.names for n in (alias.name, alias.asname) if n)]:
                if any(part.startswith("_") for part in name.split(".")):
                    self.error(node, f'"{name}" is an invalid variable name because it starts with "_"')
            return super().check_import_names(node)

        def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
            outer = self.special_def
            method = getattr(node, "sandforge_method", False) and node.name in SPECIAL_METHODS
            self.special_def = node.name if method else None
            try:
                self.check_name(node, node.name)
            finally:
                self.special_def = outer
            self.check_function_argument_names(node)
            with self.print_info.new_print_scope():
                node = self.node_contents_visit(node)
                self.inject_print_collector(node)
            owner = getattr(node, "sandforge_self", None)
            if owner is not None and _OwnWrites(owner).rewrite(node):
                # once per call: is ``self`` the program's own object? Then its writes are native stores.
                check = ast.parse(f"{OWN_FLAG} = _type_({owner}).__module__ == {PROGRAM_MODULE!r}").body[0]
                first = node.body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                node.body.insert(1 if docstring else 0, ast.fix_missing_locations(ast.copy_location(check, first)))
            return node

        def visit_Attribute(self, node: ast.Attribute) -> Any:
            attr = node.attr
            if attr.startswith("_") and not (attr in SUPER_METHODS and is_super_call(node.value)):
                self.error(node, f'"{attr}" is an invalid attribute name because it starts with "_".')
            if attr.endswith("__roles__"):
                self.error(node, f'"{attr}" is an invalid attribute name because it ends with "__roles__".')
            if attr in rp.INSPECT_ATTRIBUTES:
                self.error(node, f'"{attr}" is a restricted name, that is forbidden to access in RestrictedPython.')
            node = self.node_contents_visit(node)
            if isinstance(node.ctx, ast.Load):
                if attr not in GUARDED_READS:
                    return node  # the name is checked above: a native read is the guarded read
                call = ast.Call(func=ast.Name("_getattr_", ast.Load()), args=[node.value, ast.Constant(attr)],
                                keywords=[])  # fmt: skip
                return ast.fix_missing_locations(ast.copy_location(call, node))
            guard = ast.Call(func=ast.Name("_write_", ast.Load()), args=[node.value], keywords=[])
            node.value = ast.fix_missing_locations(ast.copy_location(guard, node.value))
            return node

        # Shortcuts: RestrictedPython visits every node's fields generically; these nodes need no check.
        def visit_Constant(self, node: ast.Constant) -> Any:
            return node

        def visit_Load(self, node: ast.AST) -> Any:
            return node

        visit_Store = visit_Del = visit_Load

        def visit_Name(self, node: ast.Name) -> Any:
            if node.id in ("print", "printed"):
                return super().visit_Name(node)  # the print collector's rewriting
            if isinstance(node.ctx, ast.Load):
                self.used_names[node.id] = True
            self.check_name(node, node.id)
            return node

        def _literal(self, node: Any) -> Any:
            if all(type(element) is ast.Constant for element in node.elts):
                return node  # a data literal: nothing to check in it
            return self.node_contents_visit(node)

        visit_List = visit_Tuple = visit_Set = _literal

        def visit_Subscript(self, node: ast.Subscript) -> Any:
            return self.node_contents_visit(node)  # item access has no policy here: native

        def guard_iter(self, node: Any) -> Any:
            return self.node_contents_visit(node)  # iteration and unpacking: native

        def visit_Assign(self, node: ast.Assign) -> Any:
            return self.node_contents_visit(node)

        def visit_With(self, node: ast.With) -> Any:
            return self.node_contents_visit(node)

        def visit_AugAssign(self, node: ast.AugAssign) -> Any:
            if isinstance(node.target, ast.Attribute):
                self.error(node, "Augmented assignment of attributes is not allowed.")  # lowered before
            return self.node_contents_visit(node)  # names and items: Python's own in-place operation

        def visit_Call(self, node: ast.Call) -> Any:
            if isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
                self.error(node, f"{node.func.id.capitalize()} calls are not allowed.")
            return self.node_contents_visit(node)

        def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
            for sub in ast.walk(node.annotation):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    self.error(node, "String annotations are not allowed: name the type itself.")
                    break
            return self.node_contents_visit(node)

        def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
            for name in node.names:
                self.check_name(node, name)
            return node

        # match statements: patterns compile to native reads; the names in them are checked statically
        def visit_Match(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def visit_match_case(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def _static_reference(self, node: ast.expr) -> None:
            """A pattern's class or value reference (``Color.RED``): a dotted name, read natively."""
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and (
                    sub.attr.startswith("_") or sub.attr in rp.INSPECT_ATTRIBUTES or sub.attr in GUARDED_READS
                ):
                    self.error(node, f'"{sub.attr}" is an invalid attribute name in a pattern.')
                elif isinstance(sub, ast.Name):
                    self.check_name(node, sub.id)

        def visit_MatchValue(self, node: Any) -> Any:
            self._static_reference(node.value)
            return node

        def visit_MatchSingleton(self, node: Any) -> Any:
            return node

        def visit_MatchSequence(self, node: Any) -> Any:
            return self.node_contents_visit(node)

        def visit_MatchMapping(self, node: Any) -> Any:
            self.check_name(node, node.rest)
            for key in node.keys:
                self._static_reference(key)
            node.patterns = [self.visit(p) for p in node.patterns]
            return node

        def visit_MatchClass(self, node: Any) -> Any:
            self._static_reference(node.cls)
            for attr in node.kwd_attrs:  # read natively: what the guards read through a call is refused
                if attr.startswith("_") or attr in GUARDED_READS or attr in rp.INSPECT_ATTRIBUTES:
                    self.error(node, f'"{attr}" is an invalid attribute name in a pattern.')
            node.patterns = [self.visit(p) for p in node.patterns]
            node.kwd_patterns = [self.visit(p) for p in node.kwd_patterns]
            return node

        def visit_MatchStar(self, node: Any) -> Any:
            self.check_name(node, node.name)
            return node

        def visit_MatchAs(self, node: Any) -> Any:
            self.check_name(node, node.name)
            return self.node_contents_visit(node)

        def visit_MatchOr(self, node: Any) -> Any:
            return self.node_contents_visit(node)

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
    if tree is None:
        try:
            tree = ast.parse(code, TOOL_FILENAME, "exec")
        except (SyntaxError, ValueError) as exc:
            message = f"syntax error: {exc.msg if isinstance(exc, SyntaxError) else exc}"
            return None, [("invalid_code", getattr(exc, "lineno", None), message)]
        except (RecursionError, MemoryError):
            return None, [("invalid_code", None, "program is nested too deeply to compile")]
    refusal = inner_wall_refusal(tree)  # before lowering: it looks at annotations the lowering removes
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
