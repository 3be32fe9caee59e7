"""The program's tree before RestrictedPython sees it: the lowering of the few constructs its transformer
would refuse or slow down (``LowerForRestriction``), the rewriting of a method's writes to its own object
(``_OwnWrites``), and the names both this lowering and the restricting policy (``restricting.py``) agree on.
Standard library only, so ``compilation.py`` and the guards import it before RestrictedPython is importable."""

from __future__ import annotations

import ast
from typing import Any

from .world import _words

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
            "neg pos abs invert round floor ceil trunc int float complex index copy deepcopy "
            "aenter aexit aiter anext"
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
#: Attribute reads that stay a guard call: ``str.format`` and ``string.Formatter``'s field access, and
#: ``register`` (``abc.ABC.register``, ``typing.Mapping.register`` reach ``ABCMeta.register``).
GUARDED_READS: frozenset[str] = frozenset({"format", "format_map", "get_field", "get_value", "vformat", "register"})
#: Names RestrictedPython's generated code uses (besides ``_x_`` names): never program-local.
RESERVED_NAMES: frozenset[str] = frozenset({"_print", "_print_", "printed"})
#: Double-underscore attributes a program may read, never set (issue 38): the names and documentation of
#: classes and functions (``type(e).__name__``, ``f.__qualname__``). Read through the guard, which hands
#: out only strings (or None), so no object is reached through them.
READ_ONLY_NAMES: frozenset[str] = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
#: ``collections.namedtuple``'s documented ``_``-prefixed API: readable on every namedtuple (``urlparse``'s
#: results too), whatever module made it.
NAMEDTUPLE_API: frozenset[str] = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults"})


def is_private(name: str) -> bool:
    """A single-underscore attribute name (``_balance``, ``_helper``): never a dunder, a mangled ``__name``
    or a RestrictedPython ``_x_`` name. Decided at run time by the object's class (``guards.private_allowed``)."""
    return len(name) > 1 and name[0] == "_" and name[1] != "_" and name[-1] != "_"


#: More modules that cannot reach the system (issue 15), each audited; merged into ALLOWED_MODULES.


_BINDING_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _binds(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
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
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                child.sandforge_method = True  # type: ignore[union-attr]
                first = (child.args.posonlyargs + child.args.args)[:1]
                if first and not _binds(child, first[0].arg):
                    child.sandforge_self = first[0].arg  # type: ignore[union-attr]
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


#: The local a method sets once per call from its first parameter's class: how much of the program's own
#: object its attribute writes and private reads may do natively (``guards.OwnedClasses``' levels).
OWN_FLAG = "_own_self_"
#: The run's table of classes and their levels (``guards.OwnedClasses``), a global the program cannot name.
OWNED_TABLE = "_owned_"
#: Single-underscore names that library metaclasses put into the program's own classes' dicts and that
#: stay the library's (``ABCMeta``'s cache of a program's ``abc.ABC`` subclass): always the guard's.
LIBRARY_PRIVATE: frozenset[str] = frozenset({"_abc_impl"})


class _OwnWrites(ast.NodeTransformer):
    """In one method's body (not nested functions), the guard calls on its own never-rebound ``self``
    become a test of ``_own_self_`` (set once per call, ``restricting.SandforgePolicy.visit_FunctionDef``):

    - ``_write_(self)`` becomes ``(self if _own_self_ else _write_(self))``: a native store when ``self``'s
      class is the program's (level 1 or 2), the guard for anything else (``Class.method(library_object)``);
    - ``_write_private_(self, "_x")`` becomes ``(self if _own_self_ > 1 else _write_private_(self, "_x"))``
      and ``_getattr_(self, "_x")`` becomes ``(self._x if _own_self_ > 1 else _getattr_(self, "_x"))``:
      native when no library class in ``self``'s class's lineage can hold any ``_x`` (level 2), which is
      exactly when ``guards.private_allowed`` allows every such name. ``LIBRARY_PRIVATE`` names stay guarded.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.changed = False

    def rewrite(self, function: ast.FunctionDef) -> bool:
        function.body = [self.visit(stmt) for stmt in function.body]
        return self.changed

    def visit_FunctionDef(self, node: ast.AST) -> Any:
        return node  # a nested scope: its ``self`` is a closure variable, guarded as usual

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def _native(self, level: int, fast: ast.expr, guarded: ast.Call) -> ast.expr:
        self.changed = True
        flag: ast.expr = ast.Name(OWN_FLAG, ast.Load())
        if level > 1:
            flag = ast.Compare(flag, [ast.Gt()], [ast.Constant(1)])
        return ast.fix_missing_locations(ast.copy_location(ast.IfExp(test=flag, body=fast, orelse=guarded), guarded))

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        func, args = node.func, node.args
        if not (isinstance(func, ast.Name) and args and isinstance(args[0], ast.Name) and args[0].id == self.owner
                and not node.keywords):  # fmt: skip
            return node
        if func.id == "_write_" and len(args) == 1:
            return self._native(1, ast.Name(self.owner, ast.Load()), node)
        name = args[1].value if len(args) == 2 and isinstance(args[1], ast.Constant) else None
        if not (isinstance(name, str) and is_private(name)) or name in LIBRARY_PRIVATE:
            return node
        if func.id == "_write_private_":
            return self._native(2, ast.Name(self.owner, ast.Load()), node)
        if func.id == "_getattr_":
            return self._native(2, ast.Attribute(ast.Name(self.owner, ast.Load()), name, ast.Load()), node)
        return node
